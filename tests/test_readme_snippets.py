"""The README's Python examples run as written: each ```python block, saved as a script (no
``if __name__ == "__main__":`` guard) and run in a folder holding the data files it names, ends
with exit status 0 and leaves exactly the run folders it started, each completed. (The Python
blocks of docs/own_problem.md are a module's source and a session that loads a run folder by a
made-up name: not scripts to run.)"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
BLOCK = re.compile(r"^```python\n(.*?)^```", re.MULTILINE | re.DOTALL)


def _snippets() -> list[str]:
    return BLOCK.findall(README.read_text())


def _data_files(folder: Path) -> None:
    """The files the examples name (`cells.npz`: arrays X and y; `cells.csv`: label `kind`), a
    small two-class problem."""
    rng = np.random.default_rng(0)
    features = rng.normal(size=(120, 6)).astype(np.float32)
    labels = (features[:, 0] > 0).astype(np.int64)
    np.savez(folder / "cells.npz", X=features, y=labels)
    table = pd.DataFrame(features, columns=[f"f{i}" for i in range(6)])
    table["kind"] = np.where(labels == 1, "round", "long")
    table.to_csv(folder / "cells.csv", index=False)


def test_the_readme_has_python_examples() -> None:
    assert _snippets(), "README.md has no ```python block: this file would test nothing"


@pytest.mark.integration
@pytest.mark.parametrize("snippet", _snippets(), ids=lambda snippet: " ".join(snippet.split())[:60])
def test_a_readme_example_runs_as_a_plain_script(snippet: str, tmp_path: Path,
                                                results_dir: Path) -> None:
    _data_files(tmp_path)
    script = tmp_path / "example.py"
    script.write_text(snippet)
    env = {**os.environ, "MPLBACKEND": "Agg"}
    proc = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, text=True,
                          capture_output=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    summaries = [json.loads(path.read_text()) for path in results_dir.rglob("summary.json")]
    # each worker would have run the script again, each starting a run of its own
    runs = list((results_dir / "runs").iterdir())
    assert len(runs) == snippet.count("hetsgd.run(") == len(summaries)
    assert {summary["status"] for summary in summaries} == {"completed"}
