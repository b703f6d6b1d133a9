"""A worker process of the asynchronous engine: the step loop of :mod:`hetsgd.engines.common.worker`
run in its own process, from the coordinator's start to its report."""

from __future__ import annotations

from functools import partial

from hetsgd.config import RunConfig
from hetsgd.engines.common.links import LinkFactory
from hetsgd.engines.common.state import SharedState
from hetsgd.engines.common.worker import Worker, set_up_math
from hetsgd.engines.reports import Reports, beating, reporting, send_checkpoint, send_ready
from hetsgd.model.problem import Problem
from hetsgd.workers import WorkerSpec


def worker_process(spec: WorkerSpec, cfg: RunConfig, problem: Problem, state: SharedState,
                   reports: Reports, link_factory: LinkFactory | None = None) -> None:
    """Entry point of a spawned worker: its math set up first, then train, then report how it
    ended."""
    set_up_math(spec, cfg)
    with reporting(spec.rank, state, reports):
        with beating(state, spec.rank):
            worker = Worker(spec, cfg, problem, state, link_factory)
            send_ready(reports, spec.rank)
        state.signals.go.wait()
        worker.run(on_checkpoint=partial(send_checkpoint, reports, spec.rank))
