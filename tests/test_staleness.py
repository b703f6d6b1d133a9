"""Staleness of asynchronous updates: counted exactly on the virtual clock, from the cursor's
claims by worker processes, and summed up in summary.json."""

from __future__ import annotations

import json
import multiprocessing as mp
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from conftest import compose_config, run_config
from test_virtual_engine import Fixed

from hetsgd.config import to_run_config
from hetsgd.engines.common.links import default_link
from hetsgd.engines.common.memory import SharedMaster
from hetsgd.engines.common.state import SharedState
from hetsgd.engines.common.worker import Worker
from hetsgd.engines.virtual.coordinator import VirtualCoordinator
from hetsgd.model.step import Pending
from hetsgd.outputs.summary import RunSummary, Staleness
from hetsgd.runs import runner
from hetsgd.runs.setup import load_run_data
from hetsgd.workers import expand


def _run(tmp_path: Path, *overrides: str) -> dict:
    cfg = compose_config(*overrides)
    summary = runner.run(to_run_config(cfg), tmp_path / "run", cfg).to_dict()
    assert summary["status"] == "completed", summary["error"]
    return json.loads((tmp_path / "run" / "summary.json").read_text())


def test_the_virtual_clock_counts_the_updates_landed_while_a_step_ran() -> None:
    """Two Hogwild workers, steps of 1.0 and 2.5 virtual seconds, five chunks. Landings: worker
    0 at 1.0 (read at 0: none landed since), 2.0 (read at 1.0: none), worker 1 at 2.5 (read at
    0: both of worker 0's), worker 0 at 3.0 (read at 2.0: worker 1's), worker 1 at 5.0 (read at
    2.5: worker 0's at 3.0)."""
    num_examples = load_run_data(run_config("dataset=digits"), progress=False).train.num_examples
    cfg = run_config("algo=hogwild", "dataset=digits", "model=logreg", "devices=cpu",
                     "devices.simulated=true", "devices.groups.cpu.count=2",
                     "devices.groups.cpu.batch_size=16", f"budget.epochs={5 * 16 / num_examples}",
                     "budget.seconds=null")
    data = load_run_data(cfg, progress=False)
    master = SharedMaster.initial(cfg.model, data.problem, cfg.seed)
    specs = expand(cfg.devices)
    training = VirtualCoordinator(cfg, specs, data.problem, data.train, master, None,
                                  default_link, None, [Fixed(1.0), Fixed(2.5)]).run(None)
    counters = training.counters
    assert [row["updates"] for row in counters] == [3, 2]
    assert [row["stale_sum"] for row in counters] == [0 + 0 + 1, 2 + 1]
    assert [row["stale_max"] for row in counters] == [1, 2]
    assert Staleness.of([s.group for s in specs], counters) == Staleness(0.8, 2, {"cpu": 0.8})
    # two groups: each group's mean is over its own updates (1 / 3 and 3 / 2), not over all 5
    assert Staleness.of(["accel", "cpu"], counters) == Staleness(
        0.8, 2, {"accel": pytest.approx(1 / 3), "cpu": 1.5})


@pytest.mark.parametrize(("pipelined", "before", "after"), [
    (False, (0, 0), (0 + 3 + 1 + 2, 3)),
    # a replica's delta lands a step at the end of the next one (the last one at the end)
    (True, (0, 0), ((0 + 3) + (3 + 1) + (1 + 2) + 2, 4)),
    (True, (5, 7), (5 + 12, 7)),  # a resumed run's row keeps the staleness counted before it
], ids=["landed_at_once", "pipelined", "resumed"])
def test_a_worker_counts_the_claims_other_workers_made_until_its_step_landed(
        pipelined: bool, before: tuple[int, int], after: tuple[int, int]) -> None:
    """A worker process's measurement, on a constructed sequence: during each of its steps the
    'other workers' claim 0, 3, 1 and 2 chunks of the same cursor; its claims are not counted
    (and the largest, 3, is not the last). A step is stale until it lands: at once, or for a
    pipelined link in the next step."""
    cfg = run_config("algo=hogwild", "dataset=digits", "model=logreg", "devices=single_cpu",
                     "devices.groups.cpu.batch_size=1", "budget.epochs=1")
    data = load_run_data(cfg, progress=False)
    master = SharedMaster.initial(cfg.model, data.problem, cfg.seed)
    state = SharedState.create(data.train, master, cfg.budget.epochs, 1, mp.get_context("spawn"))
    state.counters.column("stale_sum")[0], state.counters.column("stale_max")[0] = before
    spec, = expand(cfg.devices)
    worker = Worker(spec, cfg, data.problem, state)
    if pipelined:
        worker.link = SimpleNamespace(in_flight=True, finish=lambda: 0.0)  # type: ignore[assignment]
    others = [0, 3, 1, 2]

    def step(epoch: int, start: int, size: int) -> tuple[Pending, float, float]:
        for _ in range(others.pop(0)):
            assert state.cursor.claim(5) is not None
        if not others:
            state.signals.stop.set()
        return Pending(lambda: torch.zeros(()), None, 0.0), 0.0, 0.0  # landed, copy_s, merge_s

    worker.step = step  # type: ignore[method-assign]
    worker.run()
    row = state.counters.row(0)
    assert row["updates"] == 4
    assert (row["stale_sum"], row["stale_max"]) == after
    assert state.cursor.claims == 4 + 6


def test_a_lone_worker_and_ranks_report_no_staleness(tmp_path: Path) -> None:
    """Nothing can be stale without another worker, nor where ranks step together."""
    common = ("dataset=digits", "model=logreg", "devices=cpu", "devices.simulated=true",
              "devices.groups.cpu.profile=xeon_e5_2686v4_core", "devices.groups.cpu.batch_size=16",
              "budget.epochs=0.2", "budget.seconds=null")
    lone = _run(tmp_path / "lone", "algo=hogwild", "devices.groups.cpu.count=1", *common)
    ranks = _run(tmp_path / "ranks", "algo=sync", "devices.groups.cpu.count=2", *common)
    assert "staleness" not in lone and "staleness" not in ranks
    assert RunSummary.from_dict(ranks).staleness is None


@pytest.mark.parametrize("jitter", [None, 0.0])
def test_a_simulated_48_worker_hogwild_run_spreads_its_staleness_with_jitter(
        tmp_path: Path, jitter: float | None) -> None:
    """paper_hogbatch_v100's 48 one-example Hogwild workers. Without jitter they step in
    lockstep: every update after the first round is exactly 47 stale, whatever the seed. With
    the mix's jitter some updates are staler than 47, by different amounts for each seed. The
    mean is pinned either way by the counting identity of workers that never idle:
    (W - 1) (1 - W / (2 N)), each update landing within one step of each other worker."""
    overrides = ("algo=hogwild", "devices=paper_hogbatch_v100", "dataset=digits", "model=logreg",
                 "budget.epochs=0.5", "budget.seconds=null",
                 *(() if jitter is None else (f"devices.groups.cpu.jitter={jitter}",)))
    runs = [_run(tmp_path / str(seed), *overrides, f"seed={seed}") for seed in (0, 1)]
    workers, n = 48, runs[0]["updates"]
    for summary in runs:
        assert summary["updates"] == n
        assert summary["staleness"]["mean"] == pytest.approx(
            (workers - 1) * (1 - workers / (2 * n)), rel=1e-12)
        assert summary["staleness"]["by_group"] == {"cpu": summary["staleness"]["mean"]}
    maxima = [summary["staleness"]["max"] for summary in runs]
    if jitter == 0.0:
        assert maxima == [47, 47]
    else:
        assert min(maxima) > 47 and maxima[0] != maxima[1]


@pytest.mark.integration
@pytest.mark.wall  # trains on a real-time budget
def test_real_two_worker_hogwild_reports_its_staleness(tmp_path: Path) -> None:
    summary = _run(tmp_path, "algo=hogwild", "dataset=digits", "model=logreg", "devices=cpu",
                   "devices.groups.cpu.count=2", "budget.seconds=1", "budget.epochs=null")
    staleness = RunSummary.from_dict(summary).staleness
    assert staleness is not None and isinstance(summary["staleness"]["max"], int)
    # two workers that ran for a second, thousands of steps each: some of the other's updates
    # landed while a step computed (in parallel on two cores, or by preemption on one)
    assert 0 < staleness.mean <= staleness.max and staleness.max >= 1
    assert staleness.by_group == {"cpu": pytest.approx(staleness.mean)}
