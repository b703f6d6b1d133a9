"""The virtual clock's simulation, watched as worker processes are: it runs in daemon threads of
its own, and the caller's thread waits on them, so that code that never returns there (a
plugin's link, a rank hung in its loop) fails the run within a bound, naming what hung, and a
Ctrl-C still stops the run.

Python cannot interrupt a call that does not return, so what hangs is left behind: a daemon
thread, it ends with the process. The bound is the one its real counterpart has: a worker's
step ``workers.stall_s`` (its first 4x that, as a worker process's), a rank's wait at an
exchange ``dist.timeout_s``. A stop signal reaches the waiting thread only (signals reach the
main thread): the simulation gets ``STOP_GRACE_S`` to stop at its next event, or until a second
signal, and is left behind past that.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TypeVar

from hetsgd.bounded import Hung, Stopped, stop_cause

T = TypeVar("T")
JOIN_POLL_S = 0.1  # how often the waiting thread wakes (a Ctrl-C, a bound passed)
STOP_GRACE_S = 5.0  # how long the simulation has to stop at its next event after a Ctrl-C
FIRST_STEP_ALLOWANCE = 4.0  # a worker's first step, as a worker process's (engines/common/watch)


class Progress:
    """What the simulation is calling now, and since when: a call of ``doing`` that has not
    returned within ``limit_s`` (the config's ``key``) times its allowance is hung."""

    def __init__(self, limit_s: float, key: str) -> None:
        self.limit_s, self.key = limit_s, key
        self.doing: str | None = None  # None: nothing watched (the engine's own, or bounded)
        self.since, self.allowance = time.monotonic(), 1.0

    def beat(self, doing: str | None, allowance: float = 1.0) -> None:
        """``doing`` begins now (None: what follows is not watched here)."""
        self.doing, self.since, self.allowance = doing, time.monotonic(), allowance

    def late(self) -> str | None:
        """What has not returned within its bound, as the run's error; None while in time."""
        doing, limit = self.doing, self.limit_s * self.allowance
        if doing is None or time.monotonic() - self.since <= limit:
            return None
        bound = f"{self.key}={self.limit_s:g} s"
        if self.allowance != 1:
            bound = f"{limit:g} s ({self.allowance:g}x {bound}, a first step's)"
        return (f"{doing} did not return within {bound} on the virtual clock (raise {self.key} "
                "if it is only slow)")


def wait(threads: list[threading.Thread], late: Callable[[], str | None],
         stop: Callable[[str], None]) -> bool:
    """Wait for ``threads``; whether they all ended. A stop signal calls ``stop`` once, with
    its :func:`~hetsgd.bounded.stop_cause`; threads
    that have not ended ``STOP_GRACE_S`` later, or at a second signal, are left behind (False).
    ``late`` is asked at each wake until then: what it names is raised as :class:`Hung`."""
    stopping: float | None = None
    while alive := [thread for thread in threads if thread.is_alive()]:
        try:
            alive[0].join(JOIN_POLL_S)
            if stopping is None and (why := late()) is not None:
                raise Hung(why)
            if stopping is not None and time.monotonic() - stopping > STOP_GRACE_S:
                return False
        except KeyboardInterrupt as signalled:  # a stop signal: the threads wait on nothing of it
            if stopping is not None:
                return False
            stop(stop_cause(signalled))
            stopping = time.monotonic()
    return True


def simulated(call: Callable[[], T], progress: Progress, stop: Callable[[str], None]) -> T:
    """``call()`` (a simulation) in a daemon thread, watched by ``progress``; what it raised is
    raised here. Left behind after a stop signal, it is the user's :class:`Stopped`: the run is
    interrupted, and what its journal wrote stays for ``hetsgd recover``."""
    outcome: list[T | BaseException] = []

    def run() -> None:
        try:
            outcome.append(call())
        except BaseException as exc:  # noqa: BLE001 - raised in the waiting thread
            outcome.append(exc)

    causes: list[str] = []

    def stopping(cause: str) -> None:
        causes.append(cause)
        stop(cause)

    thread = threading.Thread(target=run, name="hetsgd-simulation", daemon=True)
    thread.start()
    try:
        ended = wait([thread], progress.late, stopping)
    except Hung as exc:  # should the hung call return after all, the simulation ends at its next
        stop(str(exc))  # event
        raise
    # a join a stop signal interrupted can leave the thread reading as ended, its outcome unset
    if not ended or not outcome:
        raise Stopped(*causes[:1])
    if isinstance(outcome[0], BaseException):
        raise outcome[0]
    return outcome[0]
