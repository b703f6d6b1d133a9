"""How worker and rank processes start: from a forkserver that imported torch and the engines
once (``workers.start: forkserver``, the default), or each as a fresh interpreter (``spawn``).

A spawned worker imports torch again before it can report ready, which is most of a short run's
cost around its training (``import torch`` takes 1.4-2.9 s on the development VMs). A forkserver
is one clean process, started by :func:`warm_up` as early as the command knows how its workers
start (``hetsgd run`` before it imports the training stack, so that the forkserver's imports
overlap the coordinator's own and the data's loading); each worker is then a fork of it, with
the imports done. Isolation is
kept: every worker is still its own process, which the coordinator watches, ends and reports on
as before; a forkserver that died is started again for the next run. Nothing in the forkserver
touches CUDA (importing torch does not initialise it), so a worker forked from it still creates
its CUDA context on its own device, and the forkserver never runs an OpenMP region, which makes
forking it safe.

Environment variables are the forkserver's, fixed when it started, so each worker takes the
coordinator's environment as it is at the run's start (:func:`settle`), as a spawned one would.

A worker never runs the coordinator's main script (:func:`_main_hidden`), so ``hetsgd.run``
works from a script without an ``if __name__ == "__main__":`` guard, as from a notebook.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
import types
from collections.abc import Iterator
from multiprocessing import forkserver
from multiprocessing.context import (
    ForkServerContext,
    ForkServerProcess,
    SpawnContext,
    SpawnProcess,
)
from multiprocessing.process import BaseProcess
from typing import Any

#: What the forkserver imports once: torch and every module a worker or rank unpickles its
#: target and arguments from; the first also leaves Ctrl-C and SIGHUP to the coordinator.
PRELOAD = ("hetsgd.engines.forkserver_preload", "torch", "hetsgd.algorithms",
           "hetsgd.engines.common.coordinator", "hetsgd.engines.async_shared.process",
           "hetsgd.engines.ranks.coordinator")


@contextlib.contextmanager
def _main_hidden() -> Iterator[None]:
    """While a process starts, a blank ``__main__`` for multiprocessing to describe to it.

    Multiprocessing sends a child the path of the parent's main script
    (``spawn.get_preparation_data``), which the child runs again, as ``__mp_main__``, before its
    target: a script that calls ``hetsgd.run`` at top level would start a run in every worker.
    A worker needs nothing from that script: its target and arguments live in hetsgd's modules,
    and a custom model in a module of its own (``model._target_`` may not name ``__main__``).
    The real module is put back as soon as the child has its description (another thread that
    looks ``__main__`` up in sys.modules within those milliseconds sees the blank one)."""
    main = sys.modules["__main__"]
    sys.modules["__main__"] = types.ModuleType("__main__")
    try:
        yield
    finally:
        sys.modules["__main__"] = main


class _MainHidden(BaseProcess):
    """A process started under :func:`_main_hidden`. (The process object is pickled to the
    child, so each of its classes is a module-level one.)"""

    def start(self) -> None:
        with _main_hidden():
            super().start()


class _ForkServerProcess(_MainHidden, ForkServerProcess):
    pass


class _SpawnProcess(_MainHidden, SpawnProcess):
    pass


class _ForkServer(ForkServerContext):
    Process = _ForkServerProcess


class _Spawn(SpawnContext):
    Process = _SpawnProcess


def context(start: str) -> ForkServerContext | SpawnContext:
    """The multiprocessing context that starts a run's processes (``workers.start``, one of
    ``START_METHODS``). Its pickler carries torch's reductions (shared tensors pass by handle),
    which importing torch registers: every caller has imported it, and this import says so."""
    import torch.multiprocessing  # noqa: F401 - the reductions, registered on import

    return _context(start)


def _context(start: str) -> ForkServerContext | SpawnContext:
    if start == "spawn":
        return _Spawn()
    ctx = _ForkServer()
    ctx.set_forkserver_preload(list(PRELOAD))
    return ctx


def warm_up(start: str) -> None:
    """Start the forkserver now, if it is the start method and not running yet: it imports
    ``PRELOAD`` in its own process while this one goes on. Torch is not imported here, so that
    the command can call this before its own imports of torch."""
    if start == "forkserver":
        _context(start)
        forkserver.ensure_running()


def forkserver_pid() -> int | None:
    """The running forkserver's pid, in the process that started it (None before)."""
    pid = forkserver._forkserver._forkserver_pid  # type: ignore[attr-defined]  # no public handle
    return int(pid) if pid is not None else None


@contextlib.contextmanager
def start_deadline(start: str, timeout_s: float) -> Iterator[list[str]]:
    """Bound the start of a run's processes from the forkserver (``workers.start_timeout_s``):
    each start waits for the forkserver to answer with the new pid, forever if it is stopped
    or stuck. Past ``timeout_s`` it is killed (SIGKILL: a stopped process handles nothing
    else), which ends that wait with an error, and the next run starts a new one
    (``forkserver.ensure_running`` sees it gone). Yields a list that then holds why."""
    if start != "forkserver":
        yield []
        return
    forkserver.ensure_running()
    pid, killed = forkserver_pid(), []

    def kill() -> None:
        killed.append(f"the forkserver (pid {pid}) did not start the workers within "
                      f"{timeout_s:g} s (workers.start_timeout_s; stopped or stuck): killed, "
                      "the next run starts a new one")
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)  # type: ignore[arg-type]

    timer = threading.Timer(timeout_s, kill)
    timer.daemon = True
    timer.start()
    try:
        yield killed
    finally:
        timer.cancel()


# What multiprocessing reports as a fork's exit code when it cannot read it from the forkserver
# (popen_forkserver: the forkserver ended, or is ending, before the fork's code reached it).
LOST_TO_FORKSERVER = 255
FORKSERVER_POLL_S = 0.01


def forkserver_exit(wait_s: float = 0.0) -> tuple[int, int] | None:
    """The forkserver's pid and exit code (a signal's number, negated) if it has ended, else
    None, waiting up to ``wait_s`` for its end: its forks' codes are lost as it closes its
    files, a moment before its end can be read. It stays unreaped (``WNOWAIT``), for
    ``forkserver.ensure_running`` to find gone."""
    pid = forkserver_pid()
    if pid is None:
        return None
    deadline = time.monotonic() + wait_s
    while True:
        try:
            info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return None
        if info is not None and info.si_pid != 0:
            signalled = info.si_code in (os.CLD_KILLED, os.CLD_DUMPED)
            return pid, -info.si_status if signalled else info.si_status
        if time.monotonic() >= deadline:
            return None
        time.sleep(FORKSERVER_POLL_S)


def settle(environment: dict[str, str]) -> None:
    """What a worker does first, once its parent-death signal is set:

    - it takes the coordinator's environment variables, in place of the forkserver's (say a
      ``CUDA_VISIBLE_DEVICES`` set after the forkserver started); CUDA reads them when the
      worker first uses it, after this;
    - a fork of the forkserver closes its copy of the forkserver's liveness pipe, which every
      fork inherits so that it could start processes of its own. Held by the workers, it would
      keep the forkserver, their parent, alive after the coordinator died, and the workers
      with it; closed, the coordinator's death ends the forkserver and, through their
      parent-death signal, its workers."""
    if dict(os.environ) != environment:
        os.environ.clear()
        os.environ.update(environment)
    server: Any = forkserver._forkserver  # its liveness pipe has no public handle
    if server._forkserver_alive_fd is not None and server._forkserver_pid is None:  # a fork
        os.close(server._forkserver_alive_fd)
        server._forkserver_alive_fd = None
