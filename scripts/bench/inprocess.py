"""hetsgd's worker in this process, without an engine around it: what the step and scaling
sections time."""

from __future__ import annotations

import multiprocessing as mp

from hetsgd.config import RunConfig, to_run_config
from hetsgd.engines.common.links import LinkFactory
from hetsgd.engines.common.memory import SharedData, SharedMaster
from hetsgd.engines.common.state import SharedState
from hetsgd.engines.common.worker import Worker
from hetsgd.model.problem import Problem
from hetsgd.runs.setup import load_run_data
from hetsgd.workers import expand
from scripts.bench.jobs import compose_config


def training_data(data: tuple[str, ...]) -> tuple[Problem, SharedData]:
    """The bench's training set in shared memory, as a run loads it."""
    run_data = load_run_data(to_run_config(compose_config(*data)), progress=False)
    return run_data.problem, run_data.train


def worker(cfg: RunConfig, problem: Problem, data: SharedData,
           master: SharedMaster | None = None, link: LinkFactory | None = None) -> Worker:
    """The one worker of ``cfg``'s mix, in this process, with a cursor of its own over ``data``
    (``cfg.budget.epochs`` of it), on ``master`` (by default a fresh initial model), through
    ``link`` (by default its role's)."""
    master = master or SharedMaster.initial(cfg.model, problem, cfg.seed)
    state = SharedState.create(data, master, cfg.budget.epochs, 1, mp.get_context("spawn"))
    spec, = expand(cfg.devices)
    return Worker(spec, cfg, problem, state, link)
