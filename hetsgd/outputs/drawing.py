"""A run's figures drawn after it ends: a view of the files just written, so that failing to
draw them (a run that failed before training has no curves) costs a warning, never the run."""

from __future__ import annotations

import logging
from pathlib import Path

from hetsgd.errors import out_of_memory

log = logging.getLogger("hetsgd")


def draw_figures(run_dir: Path) -> list[Path]:
    """``run_dir``'s figures, drawn into its ``figures/``; the files drawn (none where they
    could not be, with a warning saying why)."""
    try:
        from hetsgd.outputs.run_figures import plot_run  # matplotlib loads only here

        return plot_run(run_dir)
    except Exception as exc:  # noqa: BLE001 - the results are on disk; say why figures are missing
        log.warning("could not draw the figures of %s: %s", run_dir, out_of_memory(exc) or exc)
        return []
