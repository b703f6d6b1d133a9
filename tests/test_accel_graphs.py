"""An accelerator's step replayed from CUDA graphs (``devices.cuda_graphs``, engines/graphs.py):
on a GPU it trains to the same parameters as the eager step; without CUDA, or when capture
fails, it steps eagerly to those same parameters and says so once; the summary records which."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from conftest import compose_config
from torch import nn

from hetsgd.config import SGDConfig, to_run_config
from hetsgd.engines import device_ops, graphs
from hetsgd.engines.graphs import GraphedStep
from hetsgd.model.flat import FlatModel
from hetsgd.model.step import Step, build_step
from hetsgd.runs import runner

CPU, CUDA = torch.device("cpu"), torch.device("cuda:0")
# two batch sizes (a controller's change) and a milestone (a new learning rate): three graphs
SCHEDULE = [(0.0, 8)] * 3 + [(0.0, 5)] * 2 + [(1.0, 8)] * 3
OPTIM = SGDConfig(lr=0.5, momentum=0.5, milestones=[1.0], lr_decay=0.1)


def _net(device: torch.device, norm: bool = False) -> nn.Module:
    """A small net; ``norm``: with a batch norm, whose running statistics are buffers."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 5), *([nn.BatchNorm1d(5)] if norm else []), nn.Tanh(),
                         nn.Linear(5, 3)).to(device)


def _train(step: Step, flat: FlatModel, device: torch.device) -> list[float]:
    """Steps on fixed batches along SCHEDULE; the losses read after each."""
    torch.manual_seed(1)
    x, y = torch.randn(8, 6), torch.randint(0, 3, (8,))
    losses = []
    for epoch, size in SCHEDULE:
        pending = step.compute(x[:size].to(device), y[:size].to(device), epoch, size)
        step.land(pending)
        losses.append(float(pending.loss))
    return losses


def _pair(device: torch.device, step_choice: str,
          norm: bool = False) -> tuple[FlatModel, Step, FlatModel, Step]:
    eager, graphed = FlatModel(_net(device, norm)), FlatModel(_net(device, norm))
    return (eager, build_step(step_choice, eager, OPTIM, "multiclass"), graphed,
            GraphedStep(build_step(step_choice, graphed, OPTIM, "multiclass"), device))


def test_without_cuda_the_graphed_step_trains_eagerly_and_says_so_once(
        caplog: pytest.LogCaptureFixture) -> None:
    eager, step, graphed, graphed_step = _pair(CPU, "fused")
    with caplog.at_level(logging.WARNING, logger="hetsgd"):
        assert _train(graphed_step, graphed, CPU) == _train(step, eager, CPU)
    torch.testing.assert_close(graphed.params, eager.params, rtol=0, atol=0)
    assert [r.getMessage() for r in caplog.records] == [
        "cuda graphs: this worker computes on cpu, not a CUDA device: it steps eagerly"]


def test_a_failed_capture_puts_the_model_back_and_steps_eagerly_from_then_on(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """The warm-up runs (streams stand in for CUDA's), then the capture fails at its end, as it
    may on a GPU (here the captured step has run on the CPU): the warm-up's and the capture's
    steps are undone (the running statistics too), the step is taken eagerly, and no key
    tries again."""
    eager, step, graphed, _ = _pair(CPU, "autograd", norm=True)
    monkeypatch.setattr(device_ops, "is_cuda", lambda device: True)
    graphed_step = GraphedStep(build_step("autograd", graphed, OPTIM, "multiclass"), CPU)
    monkeypatch.setattr(torch.cuda, "Stream", _Stream)
    monkeypatch.setattr(torch.cuda, "current_stream", _Stream)
    monkeypatch.setattr(torch.cuda, "stream", lambda stream: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "CUDAGraph", _Stream)
    monkeypatch.setattr(torch.cuda, "graph", _failing_capture)
    caplog.clear()  # _pair's CPU step said it steps eagerly
    with caplog.at_level(logging.WARNING, logger="hetsgd"):
        _train(graphed_step, graphed, CPU)
    _train(step, eager, CPU)
    torch.testing.assert_close(graphed.params, eager.params, rtol=0, atol=0)
    torch.testing.assert_close(graphed.buffers, eager.buffers, rtol=0, atol=0)
    assert graphed_step.eager_reason == "capture failed: RuntimeError"
    assert not graphed_step.graphs
    assert [r.getMessage() for r in caplog.records] == [
        "cuda graphs: capturing the step of batch size 8 failed (RuntimeError: no graphs here); "
        "this worker steps eagerly"]


@pytest.mark.parametrize("layout", ["dense", "sparse"])
def test_a_key_is_captured_at_its_second_step_in_a_row_never_for_an_epochs_tail(
        monkeypatch: pytest.MonkeyPatch, layout: str) -> None:
    """Tails of 3 between steps of 8 (an epoch's last chunk) step eagerly: no capture each
    epoch for a size seen once at a time; sparse batches (their nonzero count varies) never
    capture."""
    monkeypatch.setattr(device_ops, "is_cuda", lambda device: True)
    graphed = FlatModel(_net(CPU))
    graphed_step = GraphedStep(build_step("autograd", graphed, OPTIM, "multiclass"), CPU)
    stepped: list[int] = []
    tried: list[tuple[int, tuple[int, float]]] = []  # (step, key) of each capture
    monkeypatch.setattr(graphed_step, "_capture",
                        lambda key, *args: tried.append((len(stepped), key)))
    torch.manual_seed(1)
    x, y = torch.randn(8, 6).clamp(min=0), torch.randint(0, 3, (8,))
    for size in (8, 3, 8, 8, 3, 8, 3, 3):
        batch = x[:size] if layout == "dense" else x[:size].to_sparse_csr()
        graphed_step.compute(batch, y[:size], 0.0, size)
        stepped.append(size)
    # 8 and 3 are each seen a second time at steps 2 and 4, but not in a row until 3 and 7
    assert tried == ([(3, (8, 0.5)), (7, (3, 0.5))] if layout == "dense" else [])


class _Stream:
    """A stream (or graph) that orders nothing: the CPU has run each operation when it
    returns."""

    def __init__(self, *args: object) -> None:
        pass

    def wait_stream(self, other: object) -> None:
        pass


@contextlib.contextmanager
def _failing_capture(graph: object, pool: object = None) -> Iterator[None]:
    yield
    raise RuntimeError("no graphs here")


@pytest.mark.parametrize(("on", "simulated", "ranks", "devices", "expected"), [
    (False, False, False, [CUDA], "off"),
    (True, True, False, [CUDA], "eager (simulated)"),
    (True, False, True, [CUDA], "eager (rank processes)"),
    (True, False, False, [CPU], "eager (no CUDA)"),
    (True, False, False, [], "eager (no CUDA)"),
    (True, False, False, [CPU, CUDA], "on"),
])
def test_the_summary_label_says_whether_steps_replay_and_why_not(
        on: bool, simulated: bool, ranks: bool, devices: list[torch.device],
        expected: str) -> None:
    assert graphs.label(on, simulated, ranks, devices) == expected


@pytest.mark.wall
def test_an_emulated_run_accepts_cuda_graphs_and_records_its_eager_steps(tmp_path: Path) -> None:
    overrides = ("algo=hogbatch", "devices=emulated", "dataset=digits", "model=mlp",
                 "budget.epochs=0.2", "budget.seconds=null", "devices.cuda_graphs=true")
    cfg = compose_config(*overrides)
    summary = runner.run(to_run_config(cfg), tmp_path / "run", cfg).to_dict()
    assert summary["status"] == "completed", summary["error"]
    assert summary["cuda_graphs"] == "eager (no CUDA)"
    assert summary["updates"] > 0


@pytest.mark.gpu
@pytest.mark.parametrize("step_choice", ["fused", "autograd"])
def test_a_graphed_step_trains_to_the_eager_parameters_on_a_gpu(step_choice: str) -> None:
    eager, step, graphed, graphed_step = _pair(CUDA, step_choice)
    losses = _train(graphed_step, graphed, CUDA)
    torch.testing.assert_close(losses, _train(step, eager, CUDA))
    torch.testing.assert_close(graphed.params, eager.params)
    assert isinstance(graphed_step, GraphedStep) and graphed_step.eager_reason is None
    # (8, 0.5), (5, 0.5), (8, 0.05): each captured at its second step in a row, replayed after
    assert len(graphed_step.graphs) == 3
