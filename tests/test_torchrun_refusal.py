"""Under a torchrun launch of several ranks an asynchronous algorithm is refused on every rank, in
one line, before anything trains: rank 0 before it hands its plan over (the other ranks then
fail with its error), a follower handed such a plan by its own check; a torchrun run's summary
says how many nodes and ranks per node it spanned; a sweep whose jobs run at once on this machine
says their times compete."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from conftest import compose_config, run_config

from hetsgd import algorithms
from hetsgd.config import to_run_config
from hetsgd.engines.ranks.torchrun import check_distributed, torchrun
from hetsgd.errors import UserError
from hetsgd.outputs.summary import Launch
from hetsgd.runs import follow, runner
from hetsgd.runs.setup import Handoff
from hetsgd.workers import expand

ASYNCHRONOUS = ("algo=hogwild", "dataset=digits", "model=mlp", "devices=cpu",
                "devices.groups.cpu.count=2")
REFUSED = (r"^algo=hogwild trains its workers in one machine's shared memory, not as "
           r"torch.distributed ranks: torchrun's 2 ranks cannot run it; use algo=sync or "
           r"algo=local_sgd under torchrun, or run it without$")


def _launched(monkeypatch: pytest.MonkeyPatch, rank: int, world_size: int,
              nodes: int = 2) -> None:
    for name, value in {"TORCHELASTIC_RUN_ID": "test", "RANK": rank, "WORLD_SIZE": world_size,
                        "LOCAL_RANK": 0, "GROUP_WORLD_SIZE": nodes,
                        "LOCAL_WORLD_SIZE": world_size // nodes}.items():
        monkeypatch.setenv(name, str(value))


def test_only_several_torchrun_ranks_refuse_an_asynchronous_algorithm(
        monkeypatch: pytest.MonkeyPatch) -> None:
    check_distributed("hogwild", distributed=False)  # not under torchrun: it trains here
    _launched(monkeypatch, rank=0, world_size=1, nodes=1)
    check_distributed("hogwild", distributed=False)  # one rank: it trains all there is
    _launched(monkeypatch, rank=0, world_size=2)
    check_distributed("sync", distributed=True)
    with pytest.raises(UserError, match=REFUSED):
        check_distributed("hogwild", distributed=False)


def test_rank_0_refuses_before_loading_data_and_hands_the_error_over(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    handed: list[dict[str, Any]] = []
    _launched(monkeypatch, rank=0, world_size=2)
    monkeypatch.setattr(runner, "hand_off", handed.append)
    monkeypatch.setattr(runner, "load_run_data", lambda *a, **k: pytest.fail("data loaded"))
    cfg = compose_config(*ASYNCHRONOUS)
    summary = runner.run(to_run_config(cfg), tmp_path / "run", cfg)
    assert summary.status == "failed"
    assert summary.error is not None and re.match(REFUSED, summary.error), summary.error
    assert len(handed) == 1 and Handoff.from_plain(handed[0]).plan is None
    assert Handoff.from_plain(handed[0]).error == summary.error


def test_a_follower_handed_an_asynchronous_plan_refuses_it_before_loading_data(
        monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = run_config(*ASYNCHRONOUS)
    planted = Handoff(plan=algorithms.get("hogwild").plan(cfg, expand(cfg.devices))).to_plain()
    _launched(monkeypatch, rank=1, world_size=2)
    monkeypatch.setattr(follow, "receive", lambda: planted)
    monkeypatch.setattr(follow, "load_run_data", lambda *a, **k: pytest.fail("data loaded"))
    with pytest.raises(UserError, match=REFUSED):
        follow.follow(list(ASYNCHRONOUS))


def test_the_summary_records_the_nodes_and_ranks_per_node(
        monkeypatch: pytest.MonkeyPatch) -> None:
    assert Launch.of(None, workers=3) == Launch(torchrun=False, nodes=1, ranks_per_node=3)
    _launched(monkeypatch, rank=0, world_size=4, nodes=2)
    assert Launch.of(torchrun(), workers=4) == Launch(torchrun=True, nodes=2, ranks_per_node=2)
    assert Launch.from_dict(Launch(True, 2, 2).__dict__) == Launch(True, 2, 2)


@pytest.mark.parametrize("launcher", ["submitit_local", "basic"])
def test_a_sweep_whose_jobs_run_at_once_here_warns_once_that_their_times_compete(
        tmp_path: Path, launcher: str, capsys: pytest.CaptureFixture[str]) -> None:
    from hetsgd.runs.sweep_dir import settle_sweep_dir

    settle_sweep_dir([f"hydra/launcher={launcher}", "seed=0,1", f"hydra.sweep.dir={tmp_path}"],
                     multirun=True)
    warned = [line for line in capsys.readouterr().err.splitlines() if "compete" in line]
    assert warned == ([] if launcher == "basic" else [
        "hetsgd: warning: hydra/launcher=submitit_local runs the sweep's jobs at once on this "
        "machine, so their workers share its cores and their times compete; Hydra's default "
        "launcher runs them one by one"])
