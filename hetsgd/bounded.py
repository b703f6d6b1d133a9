"""A user's code called in the main process, so that however it ends the run sees it: within a
time bound, its exits caught.

Python cannot interrupt a call that does not return, so :func:`bounded` gives the user's code a
daemon thread of its own: one that hangs is left behind, and as a daemon never holds up the
process's exit. The thread also tells the code's own ``SystemExit`` or ``KeyboardInterrupt``
from the user's Ctrl-C: signals reach the main thread only, so whatever the thread catches was
raised by the code, while a Ctrl-C interrupts the wait and stops the run as ever. An
``os._exit`` in the code, which ends the process before anything can be written, is taken for
the call's duration as a ``SystemExit`` the code raised (:class:`ProcessExit`), as it is for a
whole run (:func:`exits_caught`, which the runner holds).

What the engines call many times a second (a link's steps on the virtual clock) cannot each
get a thread: the virtual clock's whole simulation runs in one, watched
(:mod:`hetsgd.engines.virtual.watch`), which raises :class:`Hung` for what it calls that hangs;
:func:`own_interrupt` tells the code's ``KeyboardInterrupt`` from a stop signal that arrived
(:class:`Stopped`, which the command's signal handlers raise).
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType
from typing import NoReturn, TypeVar

from hetsgd.errors import UserError

T = TypeVar("T")


class Stopped(KeyboardInterrupt):
    """Ctrl-C, SIGTERM or SIGHUP that arrived, as the command's handlers raise it; a plain
    ``KeyboardInterrupt`` raised in a run by user code is that code's own end. ``cause`` is how
    a run's error names the stop."""

    def __init__(self, cause: str = "interrupted by the user") -> None:
        super().__init__(cause)
        self.cause = cause


class Terminated(Stopped):
    """SIGTERM or SIGHUP, taken like Ctrl-C: stop the workers, keep what was measured, write
    everything."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"stopped by {signal.Signals(signum).name}")
        self.signum = signum

    def __reduce__(self) -> tuple[type[Terminated], tuple[int]]:  # rebuilt from its signal
        return Terminated, (self.signum,)


def stop_cause(stop: BaseException) -> str:
    """How a run's error names the stop signal that ended it: a run that a scheduler, ``kill``
    or torchrun's agent (when another rank ended) sent SIGTERM was not stopped by its user."""
    return stop.cause if isinstance(stop, Stopped) else Stopped().cause


def stop_verb(stop: BaseException) -> str:
    """How a line says that a stop ended a sweep, a search or a call: ``interrupted``
    (Ctrl-C), or ``stopped by SIGTERM``."""
    return stop.cause if isinstance(stop, Terminated) else "interrupted"


class Hung(UserError):
    """Code the engine called that did not return within its bound, where the engine cannot
    name whose code it is: the runner names the run's own targets (``algo._target_=...``)."""


class ProcessExit(SystemExit):
    """``os._exit(code)`` called by a user's code while it ran bounded."""

    def __str__(self) -> str:
        return f"os._exit({self.code})"


@contextmanager
def stops_marked() -> Iterator[None]:
    """While the block runs, a Ctrl-C that arrives raises :class:`Stopped` (in the main thread,
    the only one signals reach: elsewhere the handlers are the program's), so that a
    ``KeyboardInterrupt`` of any other kind is known to be the code's own. A handler of the
    program's own (a notebook's) still runs; what it raises is marked."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.getsignal(signal.SIGINT)
    if not callable(previous):  # ignored (SIG_IGN), or not Python's to handle
        yield
        return

    def marked(signum: int, frame: FrameType | None) -> None:
        try:
            previous(signum, frame)
        except Stopped:
            raise
        except KeyboardInterrupt:
            raise Stopped() from None

    signal.signal(signal.SIGINT, marked)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def own_interrupt(exc: BaseException) -> bool:
    """Whether ``exc`` is an end of the user's code's own making: an exit, or a
    ``KeyboardInterrupt`` no stop signal raised."""
    return isinstance(exc, SystemExit) or (isinstance(exc, KeyboardInterrupt)
                                           and not isinstance(exc, Stopped))


_real_exit = os._exit
_guards = 0  # how many bounded calls are running (os._exit is taken while any is)
_lock = threading.Lock()


def _exit_raised(code: int) -> NoReturn:
    raise ProcessExit(code)


@contextmanager
def exits_caught() -> Iterator[None]:
    """``os._exit`` raising :class:`ProcessExit` in this process while the block runs (a child
    forked meanwhile still exits: the guard is this process's only)."""
    global _guards
    pid = os.getpid()

    def guard(status: int) -> NoReturn:
        if os.getpid() != pid:
            _real_exit(status)
        _exit_raised(status)

    with _lock:
        _guards += 1
        os._exit = guard
    try:
        yield
    finally:
        with _lock:
            _guards -= 1
            if not _guards:
                os._exit = _real_exit


def bounded(call: Callable[[], T], timeout_s: float, late: str, name: str,
            failed: Callable[[BaseException], Exception]) -> T:
    """``call()`` in a daemon thread called ``name``, waited on for at most ``timeout_s``;
    whatever it raised, exits included, is raised here as ``failed(exc)`` (the caller's line
    naming the code). One that has not returned by then is the :class:`UserError` ``late``."""
    outcome: list[T | BaseException] = []

    def run() -> None:
        try:
            outcome.append(call())
        except BaseException as exc:  # noqa: BLE001 - the user's code's own, exits included
            outcome.append(exc)

    with exits_caught():
        thread = threading.Thread(target=run, name=name, daemon=True)
        thread.start()
        thread.join(timeout_s)
    if not outcome:
        raise UserError(late)
    if isinstance(outcome[0], BaseException):
        raise failed(outcome[0]) from None
    return outcome[0]
