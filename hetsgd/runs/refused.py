"""A run that fails before it starts (a value the schema's checks reject, a resume that cannot
be): its directory says so and why, as any failed run's does. Nothing here loads the training
stack, so that the command answers bad input without importing torch."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from hetsgd.config import RunConfig
from hetsgd.outputs.run_directory import RunDirectory
from hetsgd.outputs.summary import RunSummary


def refuse(run_dir: Path, cfg: RunConfig | DictConfig, resolved_config: Any, error: str,
           status: str = "failed") -> RunSummary:
    """Write the directory of a run that failed (or was stopped: ``status``) before it could
    start; its summary."""
    out = RunDirectory(run_dir)
    out.write_config(resolved_config)
    summary = replace(RunSummary.starting(cfg), status=status, error=error)
    out.write_summary(summary.to_dict())
    return summary
