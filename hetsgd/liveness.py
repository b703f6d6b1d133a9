"""Whether a process still runs, told by its pid *and* its start time: a pid alone may name
another process by now, as the kernel reuses the pids of processes that ended.

A process is recorded as ``{"host", "pid", "started"}`` (:func:`this_process`): a run's
``summary.json`` names its coordinator so while it trains, and a write in progress carries the
same in its name (:mod:`hetsgd.atomic`).
"""

from __future__ import annotations

import socket
from typing import Any

import psutil

#: How far two readings of one process's start may differ. psutil reads it in clock ticks (1/100
#: s) after the boot time, which each process reads once, from the wall clock: a clock that
#: NTP or a VM's resume stepped in between moves one reading and not the other. A pid reused
#: within a second of its last owner's start would need the kernel's pids to wrap as fast.
_SAME_START_S = 1.0


def this_process() -> dict[str, Any]:
    """This process, as :func:`is_alive` asks after it."""
    me = psutil.Process()
    return {"host": socket.gethostname(), "pid": me.pid, "started": me.create_time()}


def is_alive(process: Any) -> bool:
    """Whether the process :func:`this_process` described still runs; a reused pid has another
    start time. One on another host (a cluster job seen from the login node, a writer of a
    shared cache) cannot be asked: it reads as still running. A record that is not one (a
    damaged summary) reads as gone."""
    try:
        host, pid, started = process["host"], process["pid"], process["started"]
        if not (isinstance(host, str) and type(pid) is int and type(started) in (int, float)):
            return False
        if host != socket.gethostname():
            return True
        proc = psutil.Process(pid)
        return (abs(proc.create_time() - started) < _SAME_START_S
                and proc.status() != psutil.STATUS_ZOMBIE)
    except (psutil.Error, KeyError, TypeError, ValueError):
        return False
