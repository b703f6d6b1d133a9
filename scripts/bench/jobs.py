"""Whole hetsgd runs, in this process as `hetsgd run` makes them, on the bench's data."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
from omegaconf import DictConfig

from hetsgd.config import compose_run, to_run_config
from hetsgd.data import source_info
from hetsgd.runs import runner
from scripts.bench.load import OtherLoad
from scripts.w8a_path import W8A, cache_name  # $HETSGD_W8A and its default

# w8a's shape (49,749 + 14,951 examples, 300 features), dense, when the real file is absent
W8A_LIKE = ("dataset=synthetic", "dataset.n_samples=64700", "dataset.n_features=300")
FAST_EVAL = ("eval.every_s=1000", "eval.every_epochs=null")  # speed runs: first and last snapshot


def compose_config(*overrides: str) -> DictConfig:
    return compose_run(["progress=false", *overrides])


@dataclass
class Job:
    summary: dict[str, Any]
    workers: pd.DataFrame
    convergence: pd.DataFrame
    others: float  # share of the CPUs that other processes used during the run


class Jobs:
    """Runs jobs through ``hetsgd.runs.runner.run`` into a temporary folder; a failed run raises."""

    def __init__(self, folder: Path, data: tuple[str, ...]) -> None:
        self.folder, self.data, self.count = folder, data, 0

    def run(self, *overrides: str) -> Job:
        cfg = compose_config(*self.data, *overrides)
        self.count += 1
        run_dir = self.folder / f"run{self.count:02d}"
        with OtherLoad() as load:
            summary = runner.run(to_run_config(cfg), run_dir, cfg).to_dict()
        if summary["status"] != "completed":
            raise RuntimeError(f"{' '.join(overrides)}: {summary['status']}: {summary['error']}")
        return Job(summary, pd.read_csv(run_dir / "workers.csv"),
                   pd.read_csv(run_dir / "convergence.csv"), load.shares()[0])


def choose_data(tmp: Path) -> tuple[tuple[str, ...], str]:
    """w8a from ``$HETSGD_W8A`` (through a temporary data cache) or the cache, else w8a-like."""
    if W8A.exists():
        home = tmp / "data"
        home.mkdir()
        (home / cache_name()).symlink_to(W8A.resolve())
        os.environ["HETSGD_DATA"] = str(home)
        return ("dataset=w8a",), f"w8a ({W8A})"
    if source_info("w8a").cached:
        return ("dataset=w8a",), "w8a (data cache)"
    return W8A_LIKE, "synthetic, w8a's shape (dense; the w8a file is not here)"
