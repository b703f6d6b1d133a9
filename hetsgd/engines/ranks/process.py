"""A rank process of the distributed engine: its algorithm's :class:`~.loop.RankLoop` (bound in
by the coordinator, so this module never looks an algorithm up) run from the group's forming to
its report, as :mod:`hetsgd.engines.async_shared.process` runs a worker."""

from __future__ import annotations

from functools import partial

import torch

from hetsgd.config import RunConfig
from hetsgd.engines.common.state import SharedState
from hetsgd.engines.common.worker import set_up_math
from hetsgd.engines.ranks.group import Group
from hetsgd.engines.ranks.loop import RankLoop
from hetsgd.engines.reports import Reports, beating, reporting, send_checkpoint, send_ready
from hetsgd.model.problem import Problem
from hetsgd.workers import WorkerSpec


def rank_process(spec: WorkerSpec, cfg: RunConfig, problem: Problem, state: SharedState,
                 reports: Reports, world: list[WorkerSpec], loop_type: type[RankLoop],
                 setup: torch.Tensor) -> None:
    """Entry point of a rank: join the world, set up, report ready, wait for go, train, report.

    ``world`` is every rank's spec, ``loop_type`` the algorithm's loop and ``setup`` a [ranks,
    len(SETUP_COLUMNS)] table where rank 0 leaves what it settled, for summary.json (all bound
    with functools.partial by the coordinator)."""
    set_up_math(spec, cfg)
    group: Group | None = None
    with reporting(spec.rank, state, reports):
        try:
            with beating(state, spec.rank):
                group = Group(cfg.dist, spec.rank, world)
                loop = loop_type(spec, world, cfg, problem, state, group)
                if spec.rank == 0:
                    values = loop.setup()
                    setup.copy_(torch.tensor([values[c] for c in loop_type.SETUP_COLUMNS],
                                             dtype=torch.float64).T)
                send_ready(reports, spec.rank)
            state.signals.go.wait()
            loop.rank.ledger.start_cpu()
            loop.run(partial(send_checkpoint, reports, spec.rank))
            loop.rank.finish()
        finally:
            if group is not None:
                group.leave()
