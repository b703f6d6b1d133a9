"""How much the coordinator holds after a table is loaded into shared memory (docs/datasets.md).

    python -m scripts.table_memory TABLE.parquet|TABLE.csv

Made if missing: 600,000 rows x 20 float32 columns and a label. A tiny table of the same format
is loaded first, so that the libraries' own memory is in before the measurement starts; then the
growth of the process's PSS (psutil) is compared with the shared copy's size."""

from __future__ import annotations

import argparse
import gc
import os
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd
import psutil

from hetsgd.config import compose_run, to_run_config
from hetsgd.config.compose import quoted
from hetsgd.errors import UserError
from hetsgd.outputs.safe_text import shown
from hetsgd.outputs.terminal import run_script
from hetsgd.runs.setup import RunData, load_run_data

MIB = 2**20
PROG = "python -m scripts.table_memory"


def _table(path: Path, rows: int, columns: int = 20) -> None:
    rng = np.random.default_rng(0)
    frame = pd.DataFrame(rng.standard_normal((rows, columns)).astype(np.float32),
                         columns=[f"f{i}" for i in range(columns)])
    frame["label"] = rng.integers(0, 3, rows)
    if path.suffix == ".parquet":
        frame.to_parquet(path)
    else:
        frame.to_csv(path, index=False)


def _load(path: Path) -> RunData:
    cfg = to_run_config(compose_run(["dataset=files", f"dataset.path={quoted(path)}",
                                     "progress=false"]))
    return load_run_data(cfg, progress=False)


def main() -> None:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    parser.add_argument("table", type=Path, help="a .parquet or .csv table (made if missing)")
    path = parser.parse_args().table
    if path.suffix not in (".parquet", ".csv"):
        raise UserError(f"{shown(path)} is neither .parquet nor .csv")
    if not path.parent.is_dir():
        raise UserError(f"{shown(path.parent)} is not a directory")
    if not path.exists():
        _table(path, 600_000)
    with tempfile.TemporaryDirectory() as folder:  # never a file of the user's
        tiny = Path(folder) / f"tiny{path.suffix}"
        _table(tiny, 300)
        _load(tiny)
    gc.collect()
    before = psutil.Process().memory_full_info().pss
    data = _load(path)
    gc.collect()
    grown = psutil.Process().memory_full_info().pss - before
    shared = data.train.nbytes + data.test.nbytes
    print(f"{path.name} {os.path.getsize(path) / MIB:.0f} MiB on disk; shared copy "
          f"{shared / MIB:.1f} MiB; coordinator PSS +{grown / MIB:.1f} MiB = "
          f"{grown / shared:.2f}x the shared copy")


if __name__ == "__main__":
    run_script(PROG, main)
