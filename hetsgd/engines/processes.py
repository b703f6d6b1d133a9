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
"""

from __future__ import annotations

import multiprocessing
import os
from multiprocessing import forkserver
from multiprocessing.context import ForkServerContext, SpawnContext
from typing import Any

#: What the forkserver imports once: torch and every module a worker or rank unpickles its
#: target and arguments from; the first also leaves Ctrl-C and SIGHUP to the coordinator.
PRELOAD = ("hetsgd.engines.forkserver_preload", "torch", "hetsgd.algorithms",
           "hetsgd.engines.shared_memory.coordinator", "hetsgd.engines.distributed.coordinator")


def context(start: str) -> ForkServerContext | SpawnContext:
    """The multiprocessing context that starts a run's processes (``workers.start``, one of
    ``START_METHODS``). Its pickler carries torch's reductions (shared tensors pass by handle),
    which importing torch registers: every caller has imported it, and this import says so."""
    import torch.multiprocessing  # noqa: F401 - the reductions, registered on import

    return _context(start)


def _context(start: str) -> ForkServerContext | SpawnContext:
    if start == "spawn":
        return multiprocessing.get_context("spawn")
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(list(PRELOAD))
    return ctx


def warm_up(start: str) -> None:
    """Start the forkserver now, if it is the start method and not running yet: it imports
    ``PRELOAD`` in its own process while this one goes on. Torch is not imported here, so that
    the command can call this before its own imports of torch."""
    if start == "forkserver":
        _context(start)
        forkserver.ensure_running()


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
