"""The coordinator of a torch.distributed run, on one machine or under torchrun.

On one machine it starts every rank itself (spawned processes meeting at a free port on
``dist.master_addr``). Across machines, ``torchrun ... -m hetsgd run ...`` starts one
``hetsgd run`` per rank on every node: global rank 0 runs the whole run as usual (data, this
coordinator, snapshots, evaluation, the one run directory) but its coordinator starts only
rank 0; every other rank follows (:mod:`hetsgd.runs.follow`): it trains its rank in-process and
writes nothing.
"""

from __future__ import annotations

import math
from functools import partial

import torch

from hetsgd.config import RunConfig
from hetsgd.engines.checkpoint import Checkpoint
from hetsgd.engines.common.coordinator import FAILURE_GRACE_S, Coordinator
from hetsgd.engines.common.memory import SharedData, SharedMaster
from hetsgd.engines.counters import WorkerCounters
from hetsgd.engines.hooks import SetupSummary
from hetsgd.engines.ranks.group import RankLost, check_port, torchrun, with_free_port
from hetsgd.engines.ranks.loop import RankLoop
from hetsgd.engines.ranks.process import rank_process
from hetsgd.engines.training import Journal, MonitorFactory, OnTick, Training
from hetsgd.model.problem import Problem
from hetsgd.workers import WorkerSpec


class DistributedCoordinator(Coordinator):
    """The coordinator of a distributed run.

    On one machine it starts every rank; under torchrun only global rank 0 (torchrun starts the
    others on their nodes). Either way it keeps a counters row for every rank, which rank 0
    fills from the exchanges, and adds what rank 0 settled at setup (``setup_summary(world,
    columns)``, e.g. the tau that ``tau: auto`` chose) to summary.json. ``publishing``: rank 0
    keeps its replica to itself and copies it into the master when asked; otherwise it writes
    the master itself and the coordinator never waits for it.

    A rank may wait in a collective for up to ``dist.timeout_s`` (for a slower peer, or one that
    died), so that, plus a grace to report, is how long a rank may go without progress before it
    counts as hung, and how long ranks have to report once training ended.
    """

    noun = "rank"
    released = (f"{RankLost.__name__}:",)  # a peer's collective broke: another rank ended it

    def __init__(self, cfg: RunConfig, specs: list[WorkerSpec], problem: Problem,
                 data: SharedData, master: SharedMaster, on_tick: OnTick | None,
                 loop_type: type[RankLoop], publishing: bool,
                 setup_summary: SetupSummary, resume: Checkpoint | None = None,
                 journal: Journal | None = None) -> None:
        started_here, launch = specs, torchrun()
        if launch is not None:
            started_here = [specs[launch.rank]]  # global rank 0: the other ranks follow()
        elif cfg.dist.master_port is None:
            cfg = with_free_port(cfg)
        else:
            check_port(cfg.dist)
        self.columns = loop_type.SETUP_COLUMNS
        self.setup = torch.full((len(specs), len(self.columns)), math.nan,
                                dtype=torch.float64).share_memory_()
        super().__init__(cfg, started_here, problem, data, master, on_tick,
                         target=partial(rank_process, world=specs, loop_type=loop_type,
                                        setup=self.setup), resume=resume, journal=journal)
        self.world, self.setup_summary = specs, setup_summary
        self.state.counters = WorkerCounters(len(specs))
        self.publishers = [0] if publishing else []
        self.stall_s = self.exit_s = cfg.dist.timeout_s + FAILURE_GRACE_S

    def run(self, monitor_factory: MonitorFactory) -> Training:
        training = super().run(monitor_factory)
        training.counters = [self.state.counters.row(spec.rank) for spec in self.world]
        if not self.setup.isnan().all():
            columns = dict(zip(self.columns, self.setup.T.tolist()))
            training.extra = {**training.extra, **self.setup_summary(self.world, columns)}
        return training
