"""The look every figure shares, and saving figures so that the same files give the same bytes
(no timestamps in the metadata, fixed SVG ids): figures can be deleted and redrawn. A figure's
text (titles, legends, ticks) comes partly from run folders: it is saved with its control
characters escaped, and never through a symbolic link."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar

import matplotlib as mpl
import numpy as np
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.text import Text

from hetsgd.errors import UserError
from hetsgd.outputs.metrics import TARGETS
from hetsgd.outputs.safe_text import shown

if TYPE_CHECKING:  # matplotlib.typing is new in matplotlib 3.8
    from matplotlib.typing import RcKeyType

DPI = 100
SIZE = (6.4, 3.6)
#: Metadata that would otherwise carry a timestamp or a version, per format.
METADATA: dict[str, dict[str, Any]] = {
    "png": {"Software": None},
    "svg": {"Date": None, "Creator": None},
    "pdf": {"CreationDate": None, "Creator": None, "Producer": None},
}
STYLE: dict[RcKeyType, Any] = {
    "font.size": 9, "axes.titlesize": 9.5, "axes.labelsize": 9, "legend.fontsize": 8,
    "xtick.labelsize": 8, "ytick.labelsize": 8, "axes.grid": True, "grid.alpha": 0.3,
    "axes.spines.top": False, "axes.spines.right": False, "svg.hashsalt": "hetsgd",
}
ALGO_COLORS = {"sync": "tab:blue", "hogwild": "tab:orange", "hogbatch": "tab:green",
               "adaptive": "tab:red", "local_sgd": "tab:purple"}
SPARE_COLORS = ("tab:brown", "tab:pink", "tab:olive", "tab:cyan", "tab:gray")
GROUP_COLORS = ("#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8172b3", "#937860")
GPU_COLORS = ("tab:red", "tab:orange", "tab:brown", "tab:pink", "tab:olive", "tab:purple",
              "tab:green", "tab:gray")
LINESTYLES = ("-", "--", ":", "-.")
#: A line's marker where its colour and line style are taken already (none for the first).
MARKERS = (None, "o", "s", "^", "D", "v", "x", "+", "*", "P", "X", "<", ">", "p", "h")
GRID_POINTS = 200
#: (convergence column, axis label, figure name) of the normalized-loss figures.
def time_label(simulated: Iterable[bool]) -> str:
    """The time axis of runs: wall time, or virtual time for simulated runs (said so when a
    figure mixes both)."""
    kinds = {bool(s) for s in simulated}
    if kinds == {True}:
        return "virtual time [s]"
    return "time [s] (virtual for simulated runs)" if kinds == {True, False} else "wall time [s]"


def loss_axes(simulated: Iterable[bool]) -> tuple[tuple[str, str, str], ...]:
    """(column, axis label, figure name) of the loss figures: against time, against epochs."""
    return (("time_s", time_label(simulated), "loss_vs_time"), ("epoch", "epochs", "loss_vs_epoch"))
BAND = "mean over seeds (each held at its last value), band = min-max"

P = ParamSpec("P")
R = TypeVar("R")


def styled(draw: Callable[P, R]) -> Callable[P, R]:
    """Draw and save under one style, without touching the caller's matplotlib settings."""
    @functools.wraps(draw)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        with mpl.rc_context(STYLE):
            return draw(*args, **kwargs)
    return wrapper


def new_figure(width: float = SIZE[0]) -> tuple[Figure, Axes]:
    fig = Figure(figsize=(width, SIZE[1]), dpi=DPI)
    FigureCanvasAgg(fig)
    return fig, fig.add_subplot()


def save(fig: Figure, out_dir: Path, name: str, formats: Sequence[str]) -> list[Path]:
    """Write ``fig`` as ``out_dir/name.FORMAT``; a folder or file there that is a symbolic link
    is a one-line UserError (the figure would land wherever it points)."""
    for text in fig.findobj(Text):
        text.set_text(shown(text.get_text(), lines=True))
    files = [out_dir / f"{name}.{fmt}" for fmt in formats]
    if linked := next((p for p in (out_dir, *files) if p.is_symlink()), None):
        raise UserError(f"{linked} is a symbolic link: figures are written only inside their "
                        "run or sweep folder, never through a link")
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for fmt, path in zip(formats, files, strict=True):
        fig.savefig(path, format=fmt, dpi=DPI, bbox_inches="tight", metadata=METADATA[fmt])
        paths.append(path)
    return paths


def legend(ax: Axes, title: str | None = None) -> None:
    """Outside, right of the axes, so it never covers data."""
    if ax.get_legend_handles_labels()[0]:
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False,
                  borderaxespad=0.0, title=title, title_fontsize=8)


def normalized_axes(ax: Axes, xlabel: str, title: str) -> None:
    for i, target in enumerate(TARGETS):
        ax.axhline(target, color="0.55", linewidth=0.6, linestyle=":", zorder=0,
                   label="targets " + " / ".join(map(str, TARGETS)) if i == 0 else None)
    low = min(-0.05, ax.get_ylim()[0])
    ax.set_ylim(max(low, -1.0), 1.05)
    ax.set_xlim(left=0)
    ax.set(xlabel=xlabel, ylabel="normalized loss", title=title)
    legend(ax)


def share_bars(ax: Axes, labels: list[str], groups: list[str],
                means: np.ndarray, stds: np.ndarray) -> None:
    """Grouped bars: one cluster per label, one bar per worker group, value on top. The labels
    are escaped here: tick labels are rebuilt when the figure is drawn, after :func:`save`."""
    width = 0.8 / len(groups)
    x = np.arange(len(labels))
    for j, group in enumerate(groups):
        err = np.where(np.isfinite(stds[:, j]), stds[:, j], 0.0)
        bars = ax.bar(x + (j - (len(groups) - 1) / 2) * width, means[:, j], width,
                      yerr=err if err.any() else None, capsize=2, label=group,
                      color=GROUP_COLORS[j % len(GROUP_COLORS)])
        ax.bar_label(bars, [f"{v:.2f}" if np.isfinite(v) else "" for v in means[:, j]],
                     fontsize=7, padding=1)
    ax.set_xticks(x, [shown(label, lines=True) for label in labels])
    ax.set_ylim(0, 1.12)
    ax.set_ylabel("share of model updates")
    ax.grid(axis="x", visible=False)
    legend(ax, "worker group")
