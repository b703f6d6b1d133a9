"""A method's own numbers (``log(name, value)``) and the model it has evaluated: the table the
values travel in (last value wins, names checked, one slot per name across processes); the
page's elastic-averaging plugin (docs/own_method.md) on the virtual clock and on gloo ranks,
its logged distance in convergence.csv, summary.json and TensorBoard, its centre the model
evaluated; a link's and a controller's values on worker processes and the virtual clock; a
bad name or value failing the run in one line."""

from __future__ import annotations

import math
import os
import sys
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path

import pandas as pd
import pytest
import torch
from test_doc_commands import shown_files

import hetsgd
from hetsgd.api import RunResult
from hetsgd.engines import method_log
from hetsgd.engines.method_log import MAX_NAMES, MethodLog
from hetsgd.errors import UserError

PAGE = "docs/own_method.md"
# the virtual clock: ranks or workers as threads and events of the test's own process
SIMULATED = ("devices=paper_hogbatch_v100", "devices.groups.cpu.count=2",
             "devices.groups.accel.batch_size=64", "model=mlp", "budget.seconds=0.05",
             "budget.epochs=null", "eval.every_s=0.01", "progress=false")
# real processes: gloo ranks for a rank loop, shared-memory workers for the asynchronous engine
EMULATED = ("devices=emulated", "budget.seconds=1", "budget.epochs=null", "eval.every_s=0.2",
            "progress=false")
ASYNC = '''
import hetsgd.algorithms.api as api
from hetsgd.algorithms import hogwild, local_sgd
from hetsgd.algorithms.api import RankLoopHooks, InPlace, LinkHooks
from hetsgd.algorithms.local_sgd import LocalSGDLoop


class CountingLink(InPlace):
    """Logs the steps it has landed, in the worker's process."""

    def __init__(self, *args):
        super().__init__(*args)
        self.steps = 0

    def after_step(self):
        self.steps += 1
        api.log("link_steps", self.steps)
        return super().after_step()


class Ticking:
    """Logs the ticks it has had, in the coordinator."""

    log = []  # batches.csv's rows: none

    def __init__(self):
        self.ticks = 0

    def tick(self, elapsed, counters):
        self.ticks += 1
        api.log("ticks", self.ticks)

    def summary(self):
        return {}


class BadName(LocalSGDLoop):
    def aggregate(self):
        self.log("train_loss", 1.0)
        return super().aggregate()


class BadValue(LocalSGDLoop):
    def aggregate(self):
        self.log("gap", float("nan"))
        return super().aggregate()


def _ranks(loop):
    return lambda plan: RankLoopHooks(loop, local_sgd.setup_summary, publishing=False)


class Plugin:
    def __init__(self, hooks, plan=hogwild.plan, config=None):
        self.hooks, self.plan = hooks, plan
        if config is not None:
            self.CONFIG = config


counting = Plugin(lambda plan: LinkHooks(CountingLink, Ticking()))
bad_name = Plugin(_ranks(BadName), local_sgd.plan, local_sgd.CONFIG)
bad_value = Plugin(_ranks(BadValue), local_sgd.plan, local_sgd.CONFIG)
'''


@pytest.fixture
def plugins(tmp_path: Path, results_dir: Path) -> Iterator[Path]:
    """The page's ``mymethods`` package and this module's ``logalgos``, on sys.path and on
    PYTHONPATH (worker processes and ranks import them)."""
    root = tmp_path / "user_code"
    for name in ("mymethods/__init__.py", "mymethods/centre.py"):
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(shown_files(PAGE)[name])
    (root / "logalgos.py").write_text(textwrap.dedent(ASYNC))
    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(root))
        patch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(root),
                                                               os.environ.get("PYTHONPATH")])))
        yield root
        for module in [m for m in sys.modules if m.split(".")[0] in ("mymethods", "logalgos")]:
            del sys.modules[module]


def _run(target: str, *overrides: str) -> RunResult:
    return hetsgd.run("algo=custom", f"algo._target_={target}", *overrides)


# -- the table --------------------------------------------------------------------------------


def test_the_table_keeps_the_last_value_of_each_name_in_the_order_first_logged() -> None:
    table = MethodLog(threading.Lock())
    table.log("b", 1)
    table.log("a", torch.tensor([2.5]))
    table.log("b", 3.0)
    assert list(table.latest().items()) == [("b", 3.0), ("a", 2.5)]  # convergence.csv's order


def test_a_second_view_of_the_table_writes_the_same_slot() -> None:
    """As a worker process sees the table: the same shared tensors, no name found yet."""
    table = MethodLog(threading.Lock())
    table.log("gap", 1.0)
    worker = MethodLog(table.lock, table.names, table.values)
    worker.log("gap", 2.0)
    worker.log("other", 5.0)
    assert table.latest() == {"gap": 2.0, "other": 5.0}
    assert worker.slots == {"gap": 0, "other": 1}  # the slot the table wrote, then the next


@pytest.mark.parametrize(("name", "said"), [
    ("9lives", "is not an identifier"), ("a-b", "is not an identifier"),
    ("x" * 65, "is not an identifier"), ("", "is not an identifier"),
    ("train_loss", "one of convergence.csv's own columns"),
    ("updates_cpu", "one of convergence.csv's own columns"),
    ("time_s", "one of convergence.csv's own columns")])
def test_a_name_that_is_no_identifier_or_a_built_in_column_is_one_line(name: str,
                                                                       said: str) -> None:
    with pytest.raises(UserError, match=said) as raised:
        MethodLog(threading.Lock()).log(name, 1.0)
    assert "\n" not in str(raised.value)


@pytest.mark.parametrize(("value", "said"), [
    (math.nan, "not finite"), (math.inf, "not finite"), ("1.0", "str is not a number"),
    (True, "bool is not a number"), (torch.ones(2), "Tensor is not a number")])
def test_a_value_that_is_no_finite_number_is_one_line(value: object, said: str) -> None:
    table = MethodLog(threading.Lock())
    with pytest.raises(UserError, match=said):
        table.log("gap", value)
    assert table.latest() == {}


def test_a_name_beyond_the_tables_room_is_refused() -> None:
    table = MethodLog(threading.Lock())
    table.log("x" * 64, 1.0)  # a name of 64 bytes fills its room (65 is refused, above)
    assert table.latest() == {"x" * 64: 1.0}
    table = MethodLog(threading.Lock())
    for i in range(MAX_NAMES):
        table.log(f"n{i}", i)
    with pytest.raises(UserError, match=f"at most {MAX_NAMES} names"):
        table.log("one_more", 0.0)
    assert len(table.latest()) == MAX_NAMES


def test_log_outside_a_run_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(method_log, "_bound", None)
    with pytest.raises(UserError, match="no run is training in this process"):
        method_log.log("gap", 1.0)


# -- a rank loop ------------------------------------------------------------------------------


def _logged(result: RunResult, name: str) -> pd.Series:
    """The column ``name`` of the run's convergence.csv, checked against summary.json."""
    assert (result.exit_code, result.status) == (0, "completed"), result.summary.error
    conv = result.convergence
    assert conv is not None and name in conv
    assert result.summary.method_log is not None
    assert result.summary.method_log[name] == conv[name].iloc[-1]
    return conv[name]


def test_the_centre_plugin_logs_its_distance_on_the_virtual_clock(plugins: Path) -> None:
    result = _run("mymethods.centre", *SIMULATED, "+algo.tau=4", "logger=tensorboard")
    distance = _logged(result, "replica_distance")
    assert math.isnan(distance.iloc[0])  # the initial model: nothing logged yet
    assert (distance.iloc[1:].dropna() > 0).all() and distance.notna().sum() >= 2
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(Path(os.environ["HETSGD_RESULTS"]) / "tensorboard"
                                  / result.run_dir.name))
    events.Reload()
    tracked = [e.value for e in events.Scalars("method/replica_distance")]
    assert tracked == pytest.approx(distance.dropna().tolist(), rel=1e-6)


def test_the_model_evaluated_is_the_one_the_loop_names(plugins: Path) -> None:
    """With ``follow=0`` the centre never moves: every snapshot evaluates the initial model,
    while the replicas train (their distance from it grows)."""
    still = _run("mymethods.centre", *SIMULATED, "+algo.tau=4", "+algo.follow=0")
    distance = _logged(still, "replica_distance").dropna()
    assert distance.iloc[-1] > distance.iloc[0] > 0
    conv = still.convergence
    assert conv is not None and len(conv) >= 3
    assert conv["train_loss"].tolist() == [conv["train_loss"].iloc[0]] * len(conv)
    moving = _run("mymethods.centre", *SIMULATED, "+algo.tau=4")
    assert moving.convergence is not None
    assert moving.convergence["train_loss"].iloc[-1] != conv["train_loss"].iloc[0]


@pytest.mark.integration
@pytest.mark.wall
def test_the_centre_plugin_logs_on_gloo_ranks(plugins: Path) -> None:
    result = _run("mymethods.centre", *EMULATED, "+algo.tau=4")
    assert _logged(result, "replica_distance").dropna().gt(0).all()


@pytest.mark.parametrize(("plugin", "said"), [
    ("bad_name", "log(): name 'train_loss' is one of convergence.csv's own columns"),
    ("bad_value", "log('gap'): the value nan is not finite")])
def test_a_rank_loops_bad_log_fails_the_run_in_one_line(plugins: Path, plugin: str,
                                                        said: str) -> None:
    result = _run(f"logalgos.{plugin}", *SIMULATED)
    assert (result.exit_code, result.status) == (1, "failed")
    assert result.summary.error is not None and said in result.summary.error
    assert "\n" not in result.summary.error


# -- the asynchronous engine --------------------------------------------------------------------


@pytest.mark.parametrize("devices", [
    pytest.param(SIMULATED, id="virtual"),
    pytest.param(EMULATED, id="processes", marks=[pytest.mark.integration, pytest.mark.wall])])
def test_a_links_and_a_controllers_values_reach_convergence_csv(plugins: Path,
                                                                devices: tuple[str, ...]) -> None:
    result = _run("logalgos.counting", *devices)
    ticks, steps = _logged(result, "ticks"), _logged(result, "link_steps")
    assert math.isnan(ticks.iloc[0]) and math.isnan(steps.iloc[0])  # before the first tick
    assert ticks.dropna().is_monotonic_increasing and ticks.iloc[-1] > 1
    assert steps.iloc[-1] >= 1
