"""A torchrun rank other than global rank 0: it trains its rank in-process and writes nothing.

Global rank 0 runs the whole run (see :mod:`hetsgd.engines.ranks.coordinator`) and hands
its plan (the config it resolved, the workers) to the other ranks; they never compose a config
of their own, load the same data and meet rank 0 at the first collective.
"""

from __future__ import annotations

import multiprocessing as mp
import queue
import sys
from collections.abc import Sequence
from pathlib import Path

import torch

from hetsgd import algorithms
from hetsgd.config import compose_run, to_run_config
from hetsgd.config.compose import hydra_arguments
from hetsgd.engines.common.memory import SharedMaster
from hetsgd.engines.common.state import SharedState
from hetsgd.engines.hooks import RankLoopHooks
from hetsgd.engines.ranks.coordinator import DistributedCoordinator
from hetsgd.engines.ranks.handoff import receive
from hetsgd.engines.ranks.process import rank_process
from hetsgd.engines.ranks.torchrun import check_distributed, torchrun
from hetsgd.errors import UserError
from hetsgd.runs.setup import Handoff, load_run_data
from hetsgd.runs.trust import check_targets, named_targets, override_targets


def follow(overrides: Sequence[str]) -> int:
    """Train this rank with rank 0's plan; returns the process exit code (1 when the rank
    failed, the error on stderr). The plan comes from the torch.distributed store, which anyone
    who reaches its port can write: it may name only the model factories this rank's own
    command line (``overrides``, the same for every rank) names."""
    launch = torchrun()
    assert launch is not None, "follow() runs under torchrun only"
    handoff = Handoff.from_plain(receive())
    if handoff.plan is None:
        raise UserError(f"rank 0 failed before training: {handoff.error}")
    plan = handoff.plan
    check_targets(plan.cfg, "rank 0's plan in the torch.distributed store",
                  _named_here(overrides), "give model._target_={} on the command line")
    algorithm, plan = algorithms.followed(plan)  # a custom algorithm's settings typed again
    hooks = algorithm.hooks(plan)
    check_distributed(plan.cfg.algo.name, isinstance(hooks, RankLoopHooks))
    assert isinstance(hooks, RankLoopHooks)  # refused above: a follower has several ranks
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
        topic, rank, message = reports.get()
        if topic in ("failed", "diverged"):
            print(f"hetsgd: rank {rank} {topic}: {_said(message)}", file=sys.stderr)
            return 1
    return 0


def _said(message: str) -> str:
    """A failed rank's report as its stderr shows it: a rank that another's end released (its
    collective broke) in its one line, since the cause is the other rank's; a failure of its
    own with its traceback, which nothing else keeps (a follower writes no files)."""
    return message.partition("\n")[0] if message.startswith(DistributedCoordinator.released) else message


def _named_here(args: Sequence[str]) -> list[str]:
    """The model factories this rank's own command names: composed as rank 0 composed it, its
    ``--config-dir`` included; where that fails, those its overrides name."""
    _, parsed = hydra_arguments(args)
    overrides = list(parsed.overrides)
    if parsed.config_dir is not None:
        overrides.append(f"hydra.searchpath=[file://{Path(parsed.config_dir).resolve()}]")
    try:
        return named_targets(to_run_config(compose_run(overrides)))
    except Exception:  # noqa: BLE001 - rank 0 composed it: a follower that cannot trusts less
        return override_targets(parsed.overrides)
