"""Helpers for tests that start the `hetsgd` command and watch its processes (workers, ranks),
shared by the stopping and liveness tests."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

from hetsgd.outputs.run_directory import SNAPSHOTS


def as_a_terminal_starts_it() -> None:
    """Ctrl-C and a hangup as a terminal's foreground command gets them, even where the tests
    themselves run in the background of a script or under nohup (which start them with SIGINT or
    SIGHUP ignored, and children inherit that)."""
    for signum in (signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, signal.SIG_DFL)


def start(results: Path, *args: str) -> subprocess.Popen:
    """`hetsgd *args` in a process group of its own, as a shell starts a command."""
    env = {**os.environ, "HETSGD_RESULTS": str(results)}
    return subprocess.Popen([sys.executable, "-m", "hetsgd", *args], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            process_group=0, preexec_fn=as_a_terminal_starts_it)


def workers(proc: subprocess.Popen, count: int, timeout_s: float = 90) -> list[int]:
    """The pids of the run's worker processes (forks of the command's forkserver, or its
    spawned children), as soon as `count` of them exist, in the order they were started (pids
    ascend), which is rank order."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = []
        try:
            for child in psutil.Process(proc.pid).children():
                command = " ".join(child.cmdline())
                if "spawn_main" in command:
                    found.append(child.pid)
                elif "multiprocessing.forkserver" in command:
                    found += [fork.pid for fork in child.children()]
        except psutil.NoSuchProcess:  # one ended while we looked: look again
            continue
        if len(found) == count:
            return sorted(found)
        time.sleep(0.05)
    raise AssertionError("the workers did not start")


def await_snapshots(results: Path, count: int, timeout_s: float = 90) -> None:
    """Return once the one run in a folder of `results` (runs/, a sweep) has `count` snapshot
    files on disk."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if len(list(results.glob(f"*/*/{SNAPSHOTS}/*.pt"))) >= count:
            return
        time.sleep(0.05)
    raise AssertionError(f"fewer than {count} snapshots on disk")


def gone(pids: list[int], timeout_s: float) -> bool:
    """Whether every process of `pids` has ended (a zombie counts as ended) within `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not any(_running(pid) for pid in pids):
            return True
        time.sleep(0.2)
    return False


def _running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:  # also where it ends between a lookup and a read
        return False
