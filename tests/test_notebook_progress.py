"""In a Jupyter notebook the progress display is printed once, as training ends, without the
widget rich's live display needs there (and warns about at each refresh without it)."""

from __future__ import annotations

import builtins
import warnings

import pytest
from conftest import run_config
from rich.console import Console

from hetsgd.engines.counters import WorkerCounters
from hetsgd.observe.progress import TrainingProgress, stderr_console
from hetsgd.workers import expand


class ZMQInteractiveShell:
    """What ``get_ipython()`` returns in a Jupyter kernel, by the class name rich looks for."""


@pytest.fixture
def notebook(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(builtins, "get_ipython", ZMQInteractiveShell, raising=False)
    monkeypatch.setenv("FORCE_COLOR", "1")  # as Jupyter kernels may set it


def test_in_a_notebook_the_console_is_a_plain_one(notebook: None) -> None:
    assert Console(stderr=True).is_jupyter  # what rich would draw with: widgets
    console = stderr_console()
    assert not console.is_jupyter and not console.is_terminal


def test_in_a_notebook_progress_is_one_line_at_the_end_without_warnings(
        notebook: None, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = run_config("progress=true", "budget.epochs=null", "budget.seconds=1")
    specs = expand(cfg.devices)
    counters = WorkerCounters(len(specs))
    counters.column("examples").fill_(300.0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with TrainingProgress(cfg, specs, num_examples=100) as progress:
            assert capsys.readouterr().err == ""  # nothing while it trains
            progress.update(0.5, counters)
    assert [str(w.message) for w in caught] == []
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(lines) == 1 and f"epoch {3 * len(specs):.2f}" in lines[0]
    assert "\x1b[" not in lines[0]  # plain text: no terminal codes


def test_a_group_s_loss_is_the_mean_of_the_workers_that_have_stepped(
        notebook: None, capsys: pytest.CaptureFixture[str]) -> None:
    """A worker not yet started has no loss: its 0 halved the group's mean at the start."""
    cfg = run_config("progress=true", "devices=cpu", "devices.groups.cpu.count=2",
                     "devices.simulated=false")
    specs = expand(cfg.devices)
    counters = WorkerCounters(len(specs))
    counters.column("loss")[0], counters.column("updates")[0] = 0.8, 3
    with TrainingProgress(cfg, specs, num_examples=100) as progress:
        progress.update(0.5, counters)
    assert "cpu: loss 0.8000 " in capsys.readouterr().err
    counters.column("loss")[0] = counters.column("updates")[0] = 0
    with TrainingProgress(cfg, specs, num_examples=100) as progress:
        progress.update(0.5, counters)
    assert "cpu: loss — " in capsys.readouterr().err


def test_the_last_state_printed_is_training_s_end_not_the_last_refresh(
        notebook: None, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """Refreshes are REFRESH_S apart: a run's last ticks came sooner, so the state printed at
    its end was the first tick's (epoch 1.45 of 20, the initial loss). Each tick its own
    counters, so that a display redrawing the first tick's at the end shows it."""
    monkeypatch.setattr(TrainingProgress, "REFRESH_S", 3600.0)  # however slow this machine is
    cfg = run_config("progress=true", "budget.epochs=null", "budget.seconds=1")
    specs = expand(cfg.devices)
    first, last = WorkerCounters(len(specs)), WorkerCounters(len(specs))
    last.column("examples").fill_(2000.0)
    with TrainingProgress(cfg, specs, num_examples=100) as progress:
        progress.update(0.01, first)  # drawn
        progress.update(0.02, last)  # within REFRESH_S: not drawn then
    printed = capsys.readouterr().err
    assert f"epoch {20 * len(specs):.2f}" in printed and "epoch 0.00" not in printed
