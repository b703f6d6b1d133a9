"""A torchrun rank other than global rank 0: it trains its rank in-process and writes nothing.

Global rank 0 runs the whole run (see :mod:`hetsgd.engines.distributed.coordinator`) and hands
its plan (the config it resolved, the workers) to the other ranks; they never compose a config
of their own, load the same data and meet rank 0 at the first collective.
"""

from __future__ import annotations

import multiprocessing as mp
import queue
import sys

import torch

from hetsgd import algorithms
from hetsgd.engines.distributed.handoff import receive
from hetsgd.engines.distributed.rank import rank_process
from hetsgd.engines.distributed.torchrun import torchrun
from hetsgd.engines.hooks import DistributedHooks
from hetsgd.engines.shared_memory.memory import SharedMaster
from hetsgd.engines.shared_memory.state import SharedState
from hetsgd.errors import UserError
from hetsgd.runs.setup import Handoff, load_run_data


def follow() -> int:
    """Train this rank with rank 0's plan; returns the process exit code (1 when the rank
    failed, the error on stderr)."""
    launch = torchrun()
    assert launch is not None, "follow() runs under torchrun only"
    handoff = Handoff.from_plain(receive())
    if handoff.plan is None:
        raise UserError(f"rank 0 failed before training: {handoff.error}")
    plan = handoff.plan
    hooks = algorithms.get(plan.cfg.algo.name).hooks(plan)
    assert isinstance(hooks, DistributedHooks), "torchrun runs distributed algorithms"
    data = load_run_data(plan.cfg, progress=False, workers=plan.workers)
    master = SharedMaster.initial(plan.cfg.model, data.problem, plan.cfg.seed)
    state = SharedState.create(data.train, master, plan.cfg.budget.epochs, len(plan.workers),
                               mp.get_context("spawn"))
    state.signals.go.set()  # nobody else here to wait for: the first collective meets rank 0
    reports: queue.SimpleQueue = queue.SimpleQueue()
    setup = torch.zeros(len(plan.workers), len(hooks.loop.SETUP_COLUMNS), dtype=torch.float64)
    rank_process(plan.workers[launch.rank], plan.cfg, data.problem, state, reports,
                 world=plan.workers, loop_type=hooks.loop, setup=setup)  # setup: rank 0's to keep
    while not reports.empty():
        kind, rank, message = reports.get()
        if kind in ("failed", "diverged"):
            print(f"hetsgd: rank {rank} {kind}: {message}", file=sys.stderr)
            return 1
    return 0
