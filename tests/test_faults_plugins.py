"""A user's algorithm cannot forge or hide a run's outcome: its summary entries stay under
``plugin``; every way its code ends (``sys.exit`` of any code, its own ``KeyboardInterrupt``,
``os._exit``, a thread left running) fails the run naming it, through ``hetsgd.run`` too,
which returns; a worker that exits 0 before its report is named; the config its plan returns
is checked and recorded; what it reports (batch sizes, times) is checked; what the coordinator
calls of it is bounded, on the virtual clock too (a link, a rank)."""

from __future__ import annotations

import json
import math
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from processes import as_a_terminal_starts_it

import hetsgd
from hetsgd.api import RunResult
from hetsgd.outputs.summary import RunSummary

PACKAGE = "evilalgos"
EVIL = '''
import dataclasses
import math
import os
import sys
import threading
import time

from pathlib import Path

from hetsgd.algorithms import hogwild, local_sgd
from hetsgd.algorithms.api import RankLoopHooks, InPlace, LinkHooks
from hetsgd.algorithms.local_sgd import LocalSGDLoop


class Forger:
    """Claims the run completed, with a final loss of its own."""

    log = []

    def tick(self, elapsed, counters):
        pass

    def summary(self):
        return {"status": "completed", "error": None, "final": "fake"}


class Ticks(Forger):
    def __init__(self, act):
        self.act = act

    def tick(self, elapsed, counters):
        self.act(counters)


def _zero(counters):
    counters.column("batch_size")[0] = 0


def _with(controller):
    def hooks(plan):
        return LinkHooks(hogwild.hooks(plan).link, controller)
    return hooks


class LandsBroken(InPlace):
    def after_step(self):
        raise RuntimeError("step broke")


class ExitsInWorker(InPlace):
    def after_step(self):
        os._exit(0)


class HangsAtItsSecondLanding(InPlace):
    """Its worker's first step lands; the second never does."""

    landed = 0

    def after_step(self):
        self.landed += 1
        if self.landed == 2:
            if "EVIL_HUNG" in os.environ:  # for a test that waits for it to hang
                Path(os.environ["EVIL_HUNG"]).touch()
            time.sleep(3600)
        return super().after_step()


class ReportsNaN(InPlace):
    def after_step(self):
        super().after_step()
        return math.nan


def _planned(change):
    def plan(cfg, specs):
        planned = hogwild.plan(cfg, specs)
        change(planned.cfg)
        return planned
    return plan


def _nan_budget(cfg):
    cfg.budget.seconds = math.nan


def _replanned(cfg):
    cfg.budget.seconds = 0.04
    cfg.seed = 7


def _exits(*args):
    sys.exit(0)


def _interrupts(*args):
    raise KeyboardInterrupt


def _os_exits(*args):
    os._exit(0)


def _leaves_a_thread(cfg, specs):
    threading.Thread(target=time.sleep, args=(3600,), name="evil-poller", daemon=False).start()
    return hogwild.plan(cfg, specs)


class HangsInRank1(LocalSGDLoop):
    """Rank 1 never comes back from its first aggregation; the others wait for it."""

    def aggregate(self):
        if self.rank.spec.rank == 1:
            Path(os.environ["EVIL_HUNG"]).touch()
            time.sleep(3600)
        return super().aggregate()


class Namespace:
    def __init__(self, **attributes):
        self.__dict__.update(attributes)


forges = Namespace(plan=hogwild.plan, hooks=_with(Forger()))
forges_and_fails = Namespace(plan=hogwild.plan,
                             hooks=lambda plan: LinkHooks(LandsBroken, Forger()))
exits_in_plan = Namespace(plan=_exits, hooks=hogwild.hooks)
interrupts_in_plan = Namespace(plan=_interrupts, hooks=hogwild.hooks)
os_exits_in_plan = Namespace(plan=_os_exits, hooks=hogwild.hooks)
exits_in_hooks = Namespace(plan=hogwild.plan, hooks=_exits)
exits_in_tick = Namespace(plan=hogwild.plan, hooks=_with(Ticks(_exits)))
hangs_in_tick = Namespace(plan=hogwild.plan, hooks=_with(Ticks(lambda c: time.sleep(3600))))
zero_batch = Namespace(plan=hogwild.plan, hooks=_with(Ticks(_zero)))
worker_exits_0 = Namespace(plan=hogwild.plan, hooks=lambda plan: LinkHooks(ExitsInWorker))
reports_nan = Namespace(plan=hogwild.plan, hooks=lambda plan: LinkHooks(ReportsNaN))
hangs_in_link = Namespace(plan=hogwild.plan, hooks=lambda plan: LinkHooks(HangsAtItsSecondLanding))
nan_budget = Namespace(plan=_planned(_nan_budget), hooks=hogwild.hooks)
replans = Namespace(plan=_planned(_replanned), hooks=hogwild.hooks)
leaves_a_thread = Namespace(plan=_leaves_a_thread, hooks=hogwild.hooks)
hung_rank = Namespace(plan=local_sgd.plan, CONFIG=local_sgd.CONFIG, hooks=lambda plan:
                      RankLoopHooks(HangsInRank1, local_sgd.setup_summary, publishing=False))
'''
# the virtual clock: a run in the test's own process, in well under a second
SIMULATED = ("devices=paper_hogbatch_v100", "devices.groups.cpu.count=2",
             "devices.groups.accel.batch_size=64", "model=mlp", "budget.seconds=0.05",
             "budget.epochs=null", "eval.every_s=0.01", "progress=false")
# worker processes
EMULATED = ("devices=emulated", "budget.seconds=1", "budget.epochs=null", "progress=false")


@pytest.fixture
def evil(tmp_path: Path, results_dir: Path) -> Iterator[Path]:
    """The module ``evilalgos`` in a folder on sys.path and PYTHONPATH (workers import it)."""
    root = tmp_path / "user_code"
    root.mkdir()
    (root / f"{PACKAGE}.py").write_text(textwrap.dedent(EVIL))
    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(root))
        patch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(root),
                                                               os.environ.get("PYTHONPATH")])))
        yield root
        sys.modules.pop(PACKAGE, None)


def _run(plugin: str, *overrides: str) -> RunResult:
    return hetsgd.run("algo=custom", f"algo._target_={PACKAGE}.{plugin}", *overrides)


def _failed(capsys: pytest.CaptureFixture[str], result: RunResult, error: str) -> None:
    """The run failed with exit status 1, its summary and the command's one line saying
    ``error``."""
    assert (result.exit_code, result.status) == (1, "failed"), result.summary.error
    assert result.summary.error == error
    assert f"hetsgd: error: {error} (details in" in capsys.readouterr().err


def test_a_controllers_summary_cannot_stand_for_the_runs_own(evil: Path) -> None:
    result = _run("forges", *SIMULATED)
    assert (result.exit_code, result.status) == (0, "completed")
    summary = json.loads((result.run_dir / "summary.json").read_text())
    assert summary["plugin"] == {"status": "completed", "error": None, "final": "fake"}
    assert set(summary["final"]) == {"train_loss", "test_loss", "test_acc"}  # the run's own


def test_no_summary_entry_can_overwrite_the_runs_own() -> None:
    with pytest.raises(ValueError, match=r"summary entries \['final', 'status'\] would "
                                         r"overwrite the run's own"):
        RunSummary("completed", None, "x", "digits", "mlp", "cpu", 0,
                   extra={"status": "completed", "final": "fake", "mine": 1})


def test_a_forged_completion_beside_a_failure_stays_failed(
        evil: Path, capsys: pytest.CaptureFixture[str]) -> None:
    result = _run("forges_and_fails", *SIMULATED)
    assert (result.exit_code, result.status) == (1, "failed")
    summary = json.loads((result.run_dir / "summary.json").read_text())
    assert summary["status"] == "failed" and summary["error"].startswith("RuntimeError: step broke")
    assert "hetsgd: error: RuntimeError: step broke" in capsys.readouterr().err


@pytest.mark.parametrize("plugin, doing, raised", [
    ("exits_in_plan", "its plan", "SystemExit: 0"),
    ("exits_in_hooks", "its hooks", "SystemExit: 0"),
    ("exits_in_tick", "its controller's tick", "SystemExit: 0"),
    ("interrupts_in_plan", "its plan", "KeyboardInterrupt"),  # its own, not the user's Ctrl-C
    ("os_exits_in_plan", "its plan", "ProcessExit: os._exit(0)"),
])
def test_a_plugin_that_ends_its_own_code_fails_the_run_naming_it(
        evil: Path, capsys: pytest.CaptureFixture[str], plugin: str, doing: str,
        raised: str) -> None:
    """Through hetsgd.run, which returns: this test goes on to read what it returned."""
    result = _run(plugin, *SIMULATED)
    _failed(capsys, result, f"algo._target_={PACKAGE}.{plugin}: {doing} raised {raised}")


def test_a_plan_returning_an_out_of_range_config_is_refused(
        evil: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _failed(capsys, _run("nan_budget", *SIMULATED),
            f"algo._target_={PACKAGE}.nan_budget: the config its plan returned is refused: "
            "budget.seconds=nan is not allowed: a positive number of seconds, at most 2,592,000 "
            "(30 days), or null")


def test_the_config_a_plan_returns_is_the_one_recorded(evil: Path) -> None:
    result = _run("replans", *SIMULATED)
    assert result.status == "completed", result.summary.error
    recorded = yaml.safe_load((result.run_dir / "config.yaml").read_text())
    assert (recorded["budget"]["seconds"], recorded["seed"]) == (0.04, 7)
    assert result.summary.seed == 0  # the run as the command named it; it trained with seed 7
    assert result.summary.time_s is not None and result.summary.time_s < 0.05


def test_a_controllers_batch_size_below_one_is_refused(
        evil: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _failed(capsys, _run("zero_batch", *SIMULATED),
            f"algo._target_={PACKAGE}.zero_batch: its controller set worker 0's batch size to "
            "0; a batch size is a whole number >= 1")


def test_a_link_reporting_a_nan_time_is_refused(
        evil: Path, capsys: pytest.CaptureFixture[str]) -> None:
    result = _run("reports_nan", *SIMULATED)
    assert (result.exit_code, result.status) == (1, "failed")
    assert re.fullmatch(rf"algo\._target_={PACKAGE}\.reports_nan: its link's after_step for "
                        r"worker \d \(cpu\) reported nan s spent copying; it took \S+ s \(a "
                        r"time is finite, >= 0 and within the call\)", str(result.summary.error))


@pytest.mark.wall
def test_a_hung_controller_tick_is_bounded(
        evil: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _failed(capsys, _run("hangs_in_tick", *SIMULATED, "workers.stall_s=1"),
            f"algo._target_={PACKAGE}.hangs_in_tick: its controller's tick did not return "
            "within workers.stall_s=1 s (raise it if it is only slow)")


@pytest.mark.wall
def test_a_hung_link_on_the_virtual_clock_is_bounded(
        evil: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The simulation runs in a thread of its own: the hung call is left behind, and the run
    (this test) goes on."""
    result = _run("hangs_in_link", *SIMULATED, "workers.stall_s=1")
    assert (result.exit_code, result.status) == (1, "failed")
    assert re.fullmatch(rf"algo\._target_={PACKAGE}\.hangs_in_link: worker \d \((cpu|accel)\)'s "
                        r"link's after_step or publish did not return within "
                        r"workers\.stall_s=1 s on the virtual clock \(raise workers\.stall_s if "
                        r"it is only slow\)", str(result.summary.error)), result.summary.error
    assert f"hetsgd: error: {result.summary.error} (details in" in capsys.readouterr().err


@pytest.mark.wall
def test_a_hung_rank_on_the_virtual_clock_fails_after_dist_timeout_s(
        evil: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Rank 1 hangs before its first exchange; the others wait for it there."""
    monkeypatch.setenv("EVIL_HUNG", str(tmp_path / "hung"))
    result = _run("hung_rank", "devices=paper_biased_local", "devices.groups.accel.count=2",
                  "model=mlp", "budget.seconds=1", "budget.epochs=null", "progress=false",
                  "dist.timeout_s=1")
    _failed(capsys, result, f"algo._target_={PACKAGE}.hung_rank: rank 1 (accel) made no "
                            "progress for dist.timeout_s=1 s on the virtual clock (no step, no "
                            "exchange; the other ranks waited for it at one): raise "
                            "dist.timeout_s if it is only slow")
    assert (tmp_path / "hung").exists()  # it hung where it was meant to


@pytest.mark.integration
def test_a_worker_that_exits_0_before_its_report_is_named(
        evil: Path, capsys: pytest.CaptureFixture[str]) -> None:
    result = _run("worker_exits_0", *EMULATED)
    assert (result.exit_code, result.status) == (1, "failed")
    assert result.summary.error is not None
    assert result.summary.error.endswith("exited with code 0"), result.summary.error
    assert result.summary.error.startswith("worker ")


@pytest.mark.integration
@pytest.mark.wall
def test_a_thread_left_running_fails_the_run_and_the_command_ends(
        evil: Path, results_dir: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "hetsgd", "run", "algo=custom",
                           f"algo._target_={PACKAGE}.leaves_a_thread", *SIMULATED],
                          text=True, capture_output=True, timeout=300)
    assert proc.returncode == 1, proc.stderr
    error = (f"algo._target_={PACKAGE}.leaves_a_thread: left 1 non-daemon thread(s) running "
             "after the run ('evil-poller'), which would keep the process alive: end them with "
             "the run, or make them daemons")
    assert f"hetsgd: error: {error}" in proc.stderr
    (summary,) = [json.loads(p.read_text()) for p in results_dir.rglob("summary.json")]
    assert (summary["status"], summary["error"]) == ("failed", error)


@pytest.mark.integration
@pytest.mark.parametrize("signum, code, why", [(signal.SIGINT, 130, "interrupted by the user"),
                                               (signal.SIGTERM, 143, "stopped by SIGTERM")])
@pytest.mark.wall
def test_ctrl_c_and_sigterm_end_a_simulated_run_whose_rank_hangs(
        evil: Path, results_dir: Path, tmp_path: Path, signum: int, code: int, why: str) -> None:
    """The other ranks wait for the hung one at a barrier, which the signal releases. The error
    names the stop: a SIGTERM (a scheduler's, torchrun's agent's) is not its user's Ctrl-C."""
    hung = tmp_path / "hung"
    proc = subprocess.Popen(
        [sys.executable, "-m", "hetsgd", "run", "algo=custom", f"algo._target_={PACKAGE}.hung_rank",
         "devices=paper_biased_local", "model=mlp", "budget.seconds=1", "budget.epochs=null",
         "progress=false"], env={**os.environ, "EVIL_HUNG": str(hung)}, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, preexec_fn=as_a_terminal_starts_it)
    try:
        while not hung.exists() and proc.poll() is None:
            time.sleep(0.05)
        proc.send_signal(signum)
        output, _ = proc.communicate(timeout=120)  # a hang guard, not a measure
    finally:
        proc.kill()
    assert proc.returncode == code, output
    assert "Traceback" not in output, output
    (summary,) = [json.loads(p.read_text()) for p in results_dir.rglob("summary.json")]
    assert (summary["status"], summary["error"]) == ("interrupted", why)


@pytest.mark.integration
@pytest.mark.wall
def test_ctrl_c_ends_a_simulation_whose_link_hangs_keeping_its_snapshots(
        evil: Path, results_dir: Path, tmp_path: Path) -> None:
    """The simulation does not stop at its next event: it is left behind, and what it took
    stays for `hetsgd recover`."""
    hung = tmp_path / "hung"
    proc = subprocess.Popen(
        [sys.executable, "-m", "hetsgd", "run", "algo=custom",
         f"algo._target_={PACKAGE}.hangs_in_link", *SIMULATED],
        env={**os.environ, "EVIL_HUNG": str(hung)}, text=True, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, preexec_fn=as_a_terminal_starts_it)
    try:
        while not hung.exists() and proc.poll() is None:
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        _, errors = proc.communicate(timeout=120)  # a hang guard, not a measure
    finally:
        proc.kill()
    assert proc.returncode == 130, errors
    (run_dir,) = (results_dir / "runs").iterdir()
    why = ("interrupted by the user while it trained; its snapshots are kept: `hetsgd recover "
           f"{run_dir}` evaluates them")
    assert errors.splitlines() == [f"hetsgd: {why}"]
    assert json.loads((run_dir / "summary.json").read_text())["error"] == why
    recovered = subprocess.run([sys.executable, "-m", "hetsgd", "recover", str(run_dir)],
                               capture_output=True, text=True, timeout=120)
    assert recovered.returncode == 0, recovered.stderr
    assert json.loads((run_dir / "summary.json").read_text())["status"] == "interrupted"


class _SetsFirst:
    """A controller that sets worker 0's batch size to ``size`` at each tick."""

    log: list[dict] = []

    def __init__(self, size: float) -> None:
        self.size = size

    def tick(self, elapsed: float, counters: object) -> None:
        counters.column("batch_size")[0] = self.size  # type: ignore[attr-defined]

    def summary(self) -> dict:
        return {}


@pytest.mark.parametrize("size", [0.0, -5.0, 2.5, math.nan])
def test_only_the_batch_sizes_a_tick_sets_are_the_controllers(size: float) -> None:
    """A worker that has not started holds 0 in its row (it writes its own batch size as it
    starts): that is no controller's doing; what the tick sets is checked."""
    from hetsgd.algorithms.watched import Watched
    from hetsgd.engines.counters import WorkerCounters
    from hetsgd.errors import UserError
    counters = WorkerCounters(2)
    counters.column("batch_size")[0] = 8  # worker 0 started; worker 1 has not
    Watched("mine", _SetsFirst(16), timeout_s=5).tick(1.0, counters)  # type: ignore[arg-type]
    assert counters.column("batch_size").tolist() == [16, 0]
    with pytest.raises(UserError, match=r"set worker 0's batch size to .*; a batch size is a "
                                        r"whole number >= 1"):
        Watched("mine", _SetsFirst(size), timeout_s=5).tick(2.0, counters)  # type: ignore[arg-type]


class _Reports:
    """A link whose after_step reports ``seconds`` spent copying, at once."""

    def __init__(self, seconds: object) -> None:
        self.seconds = seconds

    def after_step(self) -> object:
        return self.seconds


@pytest.mark.parametrize("reported", [-1.0, 1e6, "0"])
def test_a_links_time_below_0_beyond_the_call_or_no_number_is_refused(reported: object) -> None:
    """An instant call cannot have spent 1e6 s (the margin is 1 s), nor -1 s, nor '0'."""
    from hetsgd.algorithms.watched import CheckedLink
    from hetsgd.errors import UserError
    with pytest.raises(UserError, match=r"worker 0 \(cpu\) reported .* s spent copying"):
        CheckedLink("mine", "worker 0 (cpu)", _Reports(reported)).after_step()
    assert CheckedLink("mine", "worker 0 (cpu)", _Reports(0.5)).after_step() == 0.5
