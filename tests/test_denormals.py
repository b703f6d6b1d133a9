"""Denormal floats flushed to zero where a run computes: worker and rank processes, and the
virtual engines' math in this process (``devices.flush_denormal``)."""

from __future__ import annotations

import dataclasses
import multiprocessing as mp

import pytest
import torch
from conftest import run_config
from test_virtual_engine import Fixed

from hetsgd import algorithms
from hetsgd.engines import processes
from hetsgd.engines.common.memory import SharedMaster
from hetsgd.engines.common.worker import set_up_math
from hetsgd.engines.counters import WorkerCounters
from hetsgd.engines.denormals import DENORMAL, flushed, flushing
from hetsgd.engines.hooks import LinkHooks, RankLoopHooks
from hetsgd.engines.virtual.coordinator import VirtualCoordinator
from hetsgd.engines.virtual.ranks import VirtualRanks
from hetsgd.runs.setup import load_run_data
from hetsgd.workers import expand

pytestmark = pytest.mark.skipif(not torch.set_flush_denormal(False),
                                reason="this CPU has no flush-to-zero mode to set")

SIMULATED = ("dataset=digits", "model=logreg", "devices=cpu", "devices.simulated=true",
             "devices.groups.cpu.count=2", "devices.groups.cpu.batch_size=16",
             "budget.seconds=0.2", "budget.epochs=null")


def test_flushed_sets_the_mode_meanwhile_and_restores_it() -> None:
    assert not flushing()
    with flushed(True):
        assert flushing()
        assert torch.tensor(DENORMAL) * 1.0 == 0.0
        with flushed(False):
            assert not flushing()
        assert flushing()
        with flushed(True):  # the mode it found, not the opposite of the one it set
            pass
        assert flushing()
    assert not flushing()


def _nonzero_denormals(flush: bool, results: mp.Queue) -> None:
    """A worker process's math, set up as a run sets it up (two threads), on denormals."""
    cfg = run_config("devices=cpu", f"devices.flush_denormal={str(flush).lower()}")
    set_up_math(dataclasses.replace(expand(cfg.devices)[0], threads=2), cfg)
    x = torch.full((4_000_000,), DENORMAL)  # large enough for both intra-op threads
    results.put(int((x * 1.0 != 0).sum()))


@pytest.mark.integration
@pytest.mark.parametrize("flush", [True, False])
def test_a_worker_process_flushes_on_every_intra_op_thread(flush: bool) -> None:
    ctx = processes.context("forkserver")  # where a run's workers come from
    results = ctx.Queue()
    child = ctx.Process(target=_nonzero_denormals, args=(flush, results))
    child.start()
    nonzero = results.get(timeout=120)
    child.join()
    assert nonzero == (0 if flush else 4_000_000)


def _flushing_at_ticks(engine: str, flush: bool) -> list[bool]:
    """What the coordinator's duties saw, in the thread they run in: the main thread's on the
    virtual coordinator, a rank thread's (the barrier's action) on the virtual ranks."""
    algo = "hogwild" if engine == "coordinator" else "sync"
    cfg = run_config(f"algo={algo}", *SIMULATED, f"devices.flush_denormal={str(flush).lower()}")
    data = load_run_data(cfg, progress=False)
    algorithm = algorithms.get(algo)
    plan = algorithm.plan(cfg, expand(cfg.devices))
    hooks = algorithm.hooks(plan)
    master = SharedMaster.initial(cfg.model, data.problem, cfg.seed)
    seen: list[bool] = []

    def on_tick(elapsed: float, counters: WorkerCounters) -> None:
        seen.append(flushing())

    profiles = [Fixed(0.01), Fixed(0.02)]
    if isinstance(hooks, RankLoopHooks):
        VirtualRanks(plan.cfg, plan.workers, data.problem, data.train, master, on_tick,
                     hooks.loop, hooks.setup_summary, profiles).run(None)
    else:
        assert isinstance(hooks, LinkHooks)
        VirtualCoordinator(plan.cfg, plan.workers, data.problem, data.train, master, on_tick,
                           hooks.link, hooks.controller, profiles).run(None)
    return seen


@pytest.mark.parametrize("engine", ["coordinator", "ranks"])
def test_the_virtual_engines_compute_flushed_and_restore_this_threads_mode(engine: str) -> None:
    on, off = _flushing_at_ticks(engine, True), _flushing_at_ticks(engine, False)
    assert on and all(on)
    assert off and not any(off)
    assert not flushing()
