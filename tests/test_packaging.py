"""A built wheel holds the configs: installed without the source tree, `hetsgd run` works from
any directory."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.integration
def test_a_non_editable_install_runs_from_another_directory(tmp_path: Path) -> None:
    source, wheels = tmp_path / "source", tmp_path / "wheels"
    site, elsewhere = tmp_path / "site", tmp_path / "elsewhere"
    elsewhere.mkdir()
    # Built from a copy, so the build leaves nothing in the working tree.
    shutil.copytree(ROOT / "hetsgd", source / "hetsgd",
                    ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    subprocess.run([*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", str(wheels),
                    str(source)], check=True, capture_output=True, timeout=300)
    wheel, = wheels.glob("hetsgd-*.whl")
    assert "hetsgd/conf/config.yaml" in zipfile.ZipFile(wheel).namelist()
    subprocess.run([*pip, "install", "--no-deps", "--target", str(site), str(wheel)], check=True,
                   capture_output=True, timeout=300)
    # The installed copy comes first on the path; the dependencies come from this interpreter.
    env = {**os.environ, "PYTHONPATH": str(site), "HETSGD_RESULTS": str(elsewhere / "results")}
    env.pop("HETSGD_CONF", None)
    where = subprocess.run([sys.executable, "-c", "import hetsgd; print(hetsgd.__file__)"],
                           cwd=elsewhere, env=env, capture_output=True, text=True, check=True)
    assert Path(where.stdout.strip()).is_relative_to(site)
    run = subprocess.run([sys.executable, "-m", "hetsgd", "run", "budget.epochs=1",
                          "progress=false"], cwd=elsewhere, env=env, capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    summary, = (elsewhere / "results" / "runs").glob("*/summary.json")
    assert json.loads(summary.read_text())["status"] == "completed"
