"""scripts/gpu_check.sh on a machine without a GPU: one line, exit 2, nothing run or written."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.integration
def test_gpu_check_without_a_gpu_says_so_and_exits_2_at_once(tmp_path: Path) -> None:
    fake = tmp_path / "bin"
    fake.mkdir()
    # nvidia-smi as it answers on a machine with a driver and no device: no GPU line, exit 6.
    (fake / "nvidia-smi").write_text("#!/bin/sh\necho 'No devices were found'\nexit 6\n")
    (fake / "nvidia-smi").chmod(0o755)
    out = tmp_path / "check"
    done = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_check.sh"), str(out)],
                          env={"PATH": f"{fake}:/usr/bin:/bin"}, capture_output=True, text=True,
                          timeout=30)
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr.count("\n") == 1 and "no CUDA GPU here" in done.stderr
    assert not out.exists()
