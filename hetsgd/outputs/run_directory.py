"""The run directory: the files that reports, plots, tests and scripts rely on (docs/architecture.md)."""

from __future__ import annotations

import json
import math
import platform
from pathlib import Path
from typing import Any

import pandas as pd
from omegaconf import OmegaConf

from hetsgd.machine import cpu_model, cuda_devices, usable_cores

SUMMARY = "summary.json"


def environment() -> dict[str, Any]:
    import torch  # the command line reads run directories without loading torch

    gpus = cuda_devices()
    return {
        "torch": torch.__version__,
        "python": platform.python_version(),
        "cpu_model": cpu_model(),
        "cores": usable_cores(),
        "gpus": [g["name"] for g in gpus],
        "driver": gpus[0]["driver"] if gpus else None,
    }


def _clean(value: Any) -> Any:
    """JSON has no NaN or infinity: write them as null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(v) for v in value]
    return value


class RunDirectory:
    """Writes one run's files; each writer can be called on its own, so a failed run still
    leaves a summary that says why."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.mkdir(parents=True, exist_ok=True)

    def write_config(self, config: Any) -> None:
        (self.path / "config.yaml").write_text(OmegaConf.to_yaml(config, resolve=True))

    def write_table(self, name: str, rows: list[dict[str, Any]] | pd.DataFrame) -> None:
        frame = rows if isinstance(rows, pd.DataFrame) else pd.DataFrame(rows)
        frame.to_csv(self.path / f"{name}.csv", index=False)

    def write_summary(self, summary: dict[str, Any]) -> None:
        summary = dict(summary, run_dir=str(self.path))
        (self.path / SUMMARY).write_text(json.dumps(_clean(summary), indent=2) + "\n")
