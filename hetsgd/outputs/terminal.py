"""What the command prints on the terminal: one-line errors and a run's summary table, with every
string that came from data, a folder or an exception escaped (:mod:`.safe_text`)."""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, NoReturn

from rich.console import Console
from rich.table import Table
from rich.text import Text

from hetsgd.config.labels import dataset_label, model_label
from hetsgd.errors import UserError
from hetsgd.outputs.safe_text import redacted, shown

if TYPE_CHECKING:
    from hetsgd.config import RunConfig

# Markup off: what is printed holds paths, overrides and exception text, where `[/x]` is no tag.
console = Console(markup=False)
err = Console(stderr=True, markup=False, highlight=False)


def _lines_joined(message: object) -> str:
    """``message``'s lines joined by one space. Unlike :func:`hetsgd.errors.one_line` it keeps
    the spacing inside a line: a path named in an error may hold two spaces."""
    return " ".join(line.strip() for line in str(message).splitlines() if line.strip())


def error_line(message: object) -> str:
    """An error message as it may be printed: on one line, escaped, secrets redacted."""
    return shown(redacted(_lines_joined(message)))


def print_error(message: object) -> str:
    """``hetsgd: error: MESSAGE`` on stderr (:func:`error_line`); the line."""
    line = error_line(message)
    err.print(Text.assemble(("hetsgd: error:", "red"), " ", line), soft_wrap=True)
    return line


def run_script(prog: str, main: Callable[[], int | None]) -> NoReturn:
    """Exit with ``main()``'s status, as the CLI's commands end, for a script or ``python -m``
    module: a :class:`~hetsgd.errors.UserError` (a folder it cannot read) is one line on stderr,
    ``prog: message``, escaped and its secrets redacted, and status 1."""
    try:
        status = main()
    except UserError as exc:
        print(f"{prog}: {error_line(exc)}", file=sys.stderr)
        sys.exit(1)
    sys.exit(status or 0)


def _timed(summary: Mapping[str, Any]) -> str:
    """The loss a run was timed on (``test loss``), ``train loss`` for a run written before."""
    from hetsgd.outputs.metrics import loss_name  # pandas: loaded by the run already

    targets = summary.get("target_losses")
    curve = targets.get("curve") if isinstance(targets, Mapping) else None
    return loss_name(str(curve or "train_loss"))


def summary_table(summary: Mapping[str, Any]) -> Table:
    """A run's summary (as summary.json holds it) as the table printed at its end."""
    from hetsgd.outputs.report import mix_label  # loaded by the run already

    table = Table(title=shown(f"{summary['algo']} on {summary['dataset']} ({mix_label(summary)})"),
                  show_header=False)
    table.add_column()
    table.add_column(overflow="fold")  # a path in full, over several lines if need be
    final, initial = summary.get("final") or {}, summary.get("initial") or {}
    rows = [("status", summary["status"]), ("error", summary.get("error")),
            ("training time", f"{summary.get('time_s') or 0:.2f} s"),
            ("epochs", f"{summary.get('epochs') or 0:.2f}"),
            ("updates", str(summary.get("updates_by_group"))),
            # asynchronous runs: other workers' updates landed during a step, mean / most
            ("staleness", None if not (stale := summary.get("staleness"))
             else f"{stale['mean']:.2f} / {stale['max']} (mean / max)"),
            ("train loss", f"{initial.get('train_loss', float('nan')):.4f} -> "
                           f"{final.get('train_loss', float('nan')):.4f}"),
            ("test loss / acc", f"{final.get('test_loss', float('nan')):.4f} / "
                                f"{final.get('test_acc', float('nan')):.4f}"),
            (f"time to {_timed(summary)} {' / '.join(summary.get('time_to_loss') or {})}", " / ".join(
                "—" if v is None else f"{v:.2f} s"
                for v in (summary.get("time_to_loss") or {}).values())),
            ("results", summary.get("run_dir"))]
    for key, value in rows:
        if value is not None:
            table.add_row(shown(key), shown(value))
    return table


def calibration_report(rows: list[dict[str, Any]], cfg: RunConfig) -> list[Table | str]:
    """`hetsgd machine --calibrate`'s measurements: a row per group and batch size, then the
    mix's exchange of the model where its ranks measured one."""
    from hetsgd.engines.virtual.profiles import exchange_cost  # loaded by calibrate already

    table = Table("group", "device", "label", "threads", "batch", "examples/s", "ms/step",
                  "comm ms/step",
                  title=shown(f"{model_label(cfg.model)} on {dataset_label(cfg.dataset)}, "
                              f"devices={cfg.devices.name}"))
    for row in rows:
        table.add_row(row["group"], row["device"], row["label"], str(row["threads"]),
                      str(row["batch_size"]), f"{row['examples_per_s']:,.0f}",
                      f"{row['ms_per_step']:.3f}", f"{row['comm_ms_per_step']:.3f}")
    exchange = exchange_cost(rows[0])
    if exchange is None:
        return [table]
    points = ", ".join(f"{1000 * cost:.3f} ms at a wait of {1000 * wait:.3f} ms"
                       for wait, cost in zip(exchange.waits_s, exchange.seconds))
    return [table, f"the mix's exchange of the model, a round beyond its slowest step: "
                   f"{points} (the earliest rank's)"]
