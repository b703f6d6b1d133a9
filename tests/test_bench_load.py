"""The bench's measure of other processes' load counts its own process tree as its own: a
command's forkserver and workers outlive the command a moment, orphaned, and workers forked from
a forkserver are that forkserver's children, not the bench's; neither may read as someone else's
load."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
HALF_TICK_S = 0.5 / os.sysconf("SC_CLK_TCK")
# a process whose child burns 0.3 s of CPU and writes how much it used; the process itself
# either ends at once, leaving the child an orphan, or reaps the child and stays alive
DESCENDANT = """
import os, sys, time
mode, report = sys.argv[1:]
child = os.fork()
if child == 0:
    end = time.process_time() + 0.3
    while time.process_time() < end:
        pass
    times = os.times()
    with open(report + ".tmp", "w") as f:
        f.write(str(times.user + times.system))
    os.rename(report + ".tmp", report)
    os._exit(0)
if mode == "orphan":
    os._exit(0)
os.waitpid(child, 0)
open(report + ".reaped", "w").close()
time.sleep(120)
"""
# the bench's side, in a process of its own (it becomes the reaper of its orphans): the CPU its
# tree used while the descendant ran, the live one's still alive at the end
MEASURE = """
import os, subprocess, sys, time
import psutil
from scripts.bench.load import OtherLoad

program, mode, report = sys.argv[1:]
with OtherLoad() as load:
    started = subprocess.Popen([sys.executable, "-c", program, mode, report])
    deadline = time.monotonic() + 60
    if mode == "orphan":
        started.wait()
        while time.monotonic() < deadline and not (
                os.path.exists(report) and all(c.status() == psutil.STATUS_ZOMBIE
                                               for c in psutil.Process().children())):
            time.sleep(0.02)
    else:
        while time.monotonic() < deadline and not os.path.exists(report + ".reaped"):
            time.sleep(0.02)
started.kill()
print(load.end.tree_s - load.start.tree_s)
"""


@pytest.mark.integration
@pytest.mark.parametrize("mode", ["orphan", "reaped by a live child"])
def test_a_descendants_cpu_counts_as_the_benchs_own(mode: str, tmp_path: Path) -> None:
    report = tmp_path / "descendant_cpu"
    done = subprocess.run([sys.executable, "-c", MEASURE, DESCENDANT, mode.split()[0],
                           str(report)], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          check=True)
    # both sides count whole clock ticks; the tree's is a sum and difference of floats,
    # which may land a rounding error below the same count
    assert float(done.stdout) >= float(report.read_text()) - HALF_TICK_S
    assert float(report.read_text()) > 0.25
