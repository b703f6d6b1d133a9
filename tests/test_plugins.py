"""Algorithms by `algo=custom algo._target_=...`: the built-ins through the same door, a user's
settings typed by the plugin's CONFIG, a plugin that re-exports a built-in training exactly
what it trains, the torchrun hand-off of a plugin's settings, the trust rule for targets read
back, and a bad plugin as one line naming its target."""

from __future__ import annotations

import json
import os
import re
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import compose_config, run_config

from hetsgd import algorithms
from hetsgd.algorithms.plugin import Plugin
from hetsgd.config import AdaptiveConfig, ConfigError, to_run_config
from hetsgd.config.algorithms import ALGO_SCHEMAS, CustomAlgoConfig
from hetsgd.engines.hooks import LinkHooks
from hetsgd.errors import UserError
from hetsgd.runs import runner
from hetsgd.runs.setup import Handoff
from hetsgd.runs.trust import check_targets, named_targets
from hetsgd.workers import expand

PACKAGE = "myalgos"
FILES = {
    "rehogbatch.py": '''
        from hetsgd.algorithms import hogbatch

        NAME = "rehogbatch"
        CONFIG, plan, hooks = hogbatch.CONFIG, hogbatch.plan, hogbatch.hooks
    ''',
    "readaptive.py": '''
        from hetsgd.algorithms import adaptive

        NAME = "readaptive"
        CONFIG, plan, hooks = adaptive.CONFIG, adaptive.plan, adaptive.hooks
    ''',
    "untyped.py": '''
        from functools import partial

        from hetsgd.algorithms import hogbatch
        from hetsgd.algorithms.api import InPlace, Replica, LinkHooks

        plan = hogbatch.plan


        def link(spec, module, state, merge):
            return Replica(spec, module, state, merge) if spec.accel else InPlace(spec, module, state)


        def hooks(plan):
            return LinkHooks(partial(link, merge=plan.cfg.algo.settings["merge"]))
    ''',
    "bad.py": '''
        from types import SimpleNamespace

        from hetsgd.algorithms import hogbatch, hogwild
        from hetsgd.algorithms.api import InPlace, Resident, LinkHooks


        def _raise(*args):
            raise RuntimeError("plan broke")


        def broken_link(spec, module, state):
            raise RuntimeError("link broke")


        class LandsBroken(InPlace):
            def after_step(self):
                raise RuntimeError("step broke")


        class NeverAnswers(Resident):
            def after_step(self):
                return 0.0  # publishes nothing, and never answers a publish request


        def never_answers(spec, module, state):
            return NeverAnswers(spec, module, state) if spec.accel else InPlace(spec, module, state)


        class NoFlat:
            COPIES_PER_STEP = 0

            def __init__(self, spec, module, state):
                pass

            before_step = after_step = publish = finish = lambda self: 0.0


        raises_in_plan = SimpleNamespace(plan=_raise, hooks=hogbatch.hooks)
        silent_link = SimpleNamespace(
            plan=hogbatch.plan, hooks=lambda plan: LinkHooks(never_answers))
        no_flat = SimpleNamespace(plan=hogbatch.plan, hooks=lambda plan: LinkHooks(NoFlat))
        raises_in_worker = SimpleNamespace(
            plan=hogbatch.plan, hooks=lambda plan: LinkHooks(broken_link))
        raises_mid_training = SimpleNamespace(
            plan=hogwild.plan, hooks=lambda plan: LinkHooks(LandsBroken))
        no_hooks = SimpleNamespace(plan=hogbatch.plan)
        wrong_hooks = SimpleNamespace(plan=hogbatch.plan, hooks=lambda plan: "hooks")
        wrong_config = SimpleNamespace(plan=hogbatch.plan, hooks=hogbatch.hooks, CONFIG=dict)
    ''',
}
SIMULATED = ("devices=paper_hogbatch_v100", "devices.groups.cpu.count=2",
             "devices.groups.accel.batch_size=64", "model=mlp", "budget.seconds=0.05",
             "budget.epochs=null", "eval.every_s=0.01", "progress=false")


@pytest.fixture(scope="module")
def plugins(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """The package ``myalgos`` in a folder of its own, on sys.path and on PYTHONPATH (spawned
    workers import it from there)."""
    root = tmp_path_factory.mktemp("user_code")
    (root / PACKAGE).mkdir()
    (root / PACKAGE / "__init__.py").write_text("")
    for name, text in FILES.items():
        (root / PACKAGE / name).write_text(textwrap.dedent(text))
    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(root))
        patch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(root),
                                                               os.environ.get("PYTHONPATH")])))
        yield
        for module in [m for m in sys.modules if m.split(".")[0] == PACKAGE]:
            del sys.modules[module]


@pytest.mark.parametrize("name, settings", [
    ("sync", ("split=proportional",)), ("hogwild", ()), ("hogbatch", ("merge=overwrite",)),
    ("adaptive", ("gamma=0.25", "min_accel_batch=8")), ("local_sgd", ("tau=4",))])
def test_each_builtin_is_reachable_by_its_target_with_its_own_schema(
        name: str, settings: tuple[str, ...]) -> None:
    built_in = run_config(f"algo={name}", *(f"algo.{s}" for s in settings))
    custom = run_config("algo=custom", f"algo._target_=hetsgd.algorithms.{name}",
                        *(f"+algo.{s}" for s in settings))
    assert isinstance(custom.algo, CustomAlgoConfig) and custom.algo.name == "custom"
    algorithm, typed = algorithms.choose(custom)
    assert algorithm.NAME == name and type(typed.algo) is ALGO_SCHEMAS[name]
    assert typed.algo == built_in.algo


@pytest.mark.parametrize("setting, message", [
    ("+algo.gama=0.3", r"^unknown config key\(s\) algo\.gama: hetsgd\.algorithms\.adaptive's "
                       r"CONFIG \(AdaptiveConfig\) has no such field$"),
    ("+algo.gamma=fast", r"^algo\.gamma: Value 'fast' of type 'str' could not be converted"),
    ("+algo.gamma=2", r"algo\.gamma"),
])
def test_a_plugins_settings_go_through_its_schemas_checks(setting: str, message: str) -> None:
    cfg = run_config("algo=custom", "algo._target_=hetsgd.algorithms.adaptive", setting)
    with pytest.raises(ConfigError, match=message) as raised:
        algorithms.choose(cfg)
    assert "\n" not in str(raised.value)


def test_an_untyped_plugin_keeps_its_settings_and_is_named_by_its_target(plugins: None) -> None:
    cfg = run_config("algo=custom", f"algo._target_={PACKAGE}.untyped", "+algo.merge=overwrite",
                     "devices=emulated")
    algorithm, typed = algorithms.choose(cfg)
    assert algorithm.NAME == "untyped"
    assert typed.algo == CustomAlgoConfig("untyped", f"{PACKAGE}.untyped", {"merge": "overwrite"})
    hooks = algorithm.hooks(algorithm.plan(typed, expand(typed.devices)))
    assert isinstance(hooks, LinkHooks) and hooks.controller is None


@pytest.mark.parametrize("target, message", [
    ("nosuch.mod", r"^algo\._target_=nosuch\.mod: no module named 'nosuch'; is its package on "
                   r"PYTHONPATH\?$"),  # worded as a model's (hetsgd/targets.py)
    (f"{PACKAGE}.nosuch", rf"^algo\._target_={PACKAGE}\.nosuch: {PACKAGE} has no attribute "
                          r"'nosuch'$"),
    ("os", r"algo\._target_=os: a module without plan and hooks; an algorithm provides"),
    (f"{PACKAGE}.bad.no_hooks", rf"algo\._target_={PACKAGE}\.bad\.no_hooks: a SimpleNamespace "
                                r"without hooks"),
    (f"{PACKAGE}.bad.wrong_config", r"its CONFIG is <class 'dict'>, not a dataclass"),
    ("__main__.mine", r"worker processes cannot import the script"),
])
def test_a_plugin_that_cannot_be_loaded_is_one_line_naming_it(plugins: None, target: str,
                                                              message: str) -> None:
    with pytest.raises(UserError, match=message) as raised:
        Plugin.load(target)
    assert "\n" not in str(raised.value)


@pytest.mark.parametrize("target, message", [
    (f"{PACKAGE}.bad.raises_in_plan",
     rf"^algo\._target_={PACKAGE}\.bad\.raises_in_plan: its plan raised RuntimeError: plan broke$"),
    (f"{PACKAGE}.bad.wrong_hooks",
     rf"^algo\._target_={PACKAGE}\.bad\.wrong_hooks: its hooks returned a str, not "),
    (f"{PACKAGE}.bad.raises_in_worker",
     rf"^algo\._target_={PACKAGE}\.bad\.raises_in_worker: its link for worker 0 \(accel\) raised "
     r"RuntimeError: link broke$"),
    (f"{PACKAGE}.bad.no_flat",
     rf"^algo\._target_={PACKAGE}\.bad\.no_flat: the link of worker 0 \(accel\), a NoFlat, has "
     r"no flat: the FlatModel its steps train \(see hetsgd\.algorithms\.api\.Link\)$"),
    (f"{PACKAGE}.rehogbatch",  # its own refusal keeps its line, after the target
     rf"^algo\._target_={PACKAGE}\.rehogbatch: a cuda worker cannot update the shared master"),
])
def test_a_plugin_that_raises_fails_the_run_in_one_line_naming_it(
        plugins: None, tmp_path: Path, target: str, message: str) -> None:
    """On the virtual clock, in the run's own process; the shared-memory engine's workers are
    test_a_plugin_raising_in_a_worker_process_fails_the_run_in_one_line's."""
    layout = ("devices.groups.accel.role=host",) if target.endswith("rehogbatch") else ()
    cfg = compose_config("algo=custom", f"algo._target_={target}", *SIMULATED, *layout)
    summary = runner.run(to_run_config(cfg), tmp_path / "run", cfg).to_dict()
    assert summary["status"] == "failed"
    assert summary["error"] is not None and "\n" not in summary["error"]
    assert re.search(message, summary["error"]), summary["error"]


def _failed_in_processes(tmp_path: Path, plugin: str, devices: str, *overrides: str) -> dict:
    cfg = compose_config("algo=custom", f"algo._target_={PACKAGE}.bad.{plugin}",
                         f"devices={devices}", "budget.seconds=1", "budget.epochs=null",
                         "progress=false", *overrides)
    summary = runner.run(to_run_config(cfg), tmp_path / "run", cfg).to_dict()
    assert summary["status"] == "failed"
    return summary


@pytest.mark.integration
def test_a_plugin_raising_in_a_worker_process_fails_the_run_in_one_line(
        plugins: None, tmp_path: Path) -> None:
    error = _failed_in_processes(tmp_path, "raises_in_worker", "emulated")["error"]
    assert error.startswith(f"algo._target_={PACKAGE}.bad.raises_in_worker: its link for worker ")
    assert error.endswith("raised RuntimeError: link broke")


@pytest.mark.integration
def test_a_plugin_raising_while_it_trains_is_one_line_naming_its_file(
        plugins: None, tmp_path: Path) -> None:
    """The summary says why and where, the traceback goes to error.log."""
    error = _failed_in_processes(tmp_path, "raises_mid_training", "cpu")["error"]
    assert re.fullmatch(rf"RuntimeError: step broke \(raised at \S+{PACKAGE}/bad\.py:\d+, in "
                        r"after_step\)", error), error
    assert "Traceback (most recent call last)" in (tmp_path / "run" / "error.log").read_text()


@pytest.mark.integration
def test_a_link_that_never_answers_a_publish_request_fails_the_run_naming_the_member(
        plugins: None, tmp_path: Path) -> None:
    """The coordinator waits for an accelerator's answer before each snapshot: a link that
    steps on without answering fails the run at the first snapshot, instead of stalling every
    snapshot for the stall window."""
    summary = _failed_in_processes(tmp_path, "silent_link", "emulated", "eval.every_s=0.2",
                                   "budget.seconds=30")
    assert re.fullmatch(r"worker 0 \(accel\) took \d+ steps after a publish request without "
                        r"answering it: its link's after_step\(\) must answer one "
                        r"\(state\.signals\.answer\(rank\); see hetsgd\.algorithms\.api\.Link\)",
                        summary["error"]), summary["error"]


def _simulated(tmp_path: Path, name: str, *overrides: str) -> tuple[dict, Path]:
    cfg = compose_config(*overrides, *SIMULATED)
    run_dir = tmp_path / name
    summary = runner.run(to_run_config(cfg), run_dir, cfg).to_dict()
    assert summary["status"] == "completed", summary["error"]
    return summary, run_dir


@pytest.mark.parametrize("name", ["hogbatch", "adaptive"])
def test_a_plugin_reexporting_a_builtin_trains_it_byte_for_byte(plugins: None, tmp_path: Path,
                                                                name: str) -> None:
    """On the virtual clock, where a run is deterministic: the same losses, counters and batch
    sizes, under the plugin's own name."""
    settings = ("period_s=0.01", "window_s=0.02") if name == "adaptive" else ("merge=overwrite",)
    built_in, built_in_dir = _simulated(tmp_path, "built_in", f"algo={name}",
                                        *(f"algo.{s}" for s in settings))
    plugin, plugin_dir = _simulated(tmp_path, "plugin", "algo=custom",
                                    f"algo._target_={PACKAGE}.re{name}",
                                    *(f"+algo.{s}" for s in settings))
    files = ["convergence.csv", "workers.csv", *(["batches.csv"] if name == "adaptive" else [])]
    for file in files:
        assert (plugin_dir / file).read_bytes() == (built_in_dir / file).read_bytes(), file
    assert (built_in["algo"], plugin["algo"]) == (name, f"re{name}")
    for key in ("plan", "staleness", "updates_by_group", "final"):
        assert plugin[key] == built_in[key], key
    assert plugin["final"]["train_loss"] < plugin["initial"]["train_loss"]


def test_rank_0_hands_a_plugins_settled_settings_to_torchruns_other_ranks() -> None:
    """What a follower reads back: plain data with the schemas it knows, typed again by the
    algorithm it loads, with what rank 0's plan settled."""
    chosen = run_config("algo=custom", "algo._target_=hetsgd.algorithms.adaptive",
                        "+algo.gamma=0.25", "devices=emulated")
    algorithm, cfg = algorithms.choose(chosen)
    plan = algorithm.plan(cfg, expand(cfg.devices))
    assert isinstance(plan.cfg.algo, AdaptiveConfig)
    assert plan.cfg.algo.max_accel_batch is not None  # settled by the plan
    sent = json.loads(json.dumps(Handoff(plan=algorithms.handed_off(plan, algorithm)).to_plain()))
    assert sent["plan"]["cfg"]["schemas"]["algo"] == "CustomAlgoConfig"
    received = Handoff.from_plain(sent).plan
    assert received is not None
    followed, typed = algorithms.followed(received)
    assert followed.NAME == "adaptive" and typed.cfg.algo == plan.cfg.algo
    assert typed.workers == plan.workers and typed.settled == plan.settled


def test_an_algorithm_target_read_back_is_called_only_where_the_user_names_it() -> None:
    cfg = run_config("algo=custom", "algo._target_=evil.module")
    assert named_targets(cfg) == ["evil.module"]
    with pytest.raises(UserError, match=r"^the store names algo\._target_ 'evil\.module', which "
                                        r".*: add algo=custom algo\._target_=evil\.module to your "
                                        r"command to call it$"):
        check_targets(cfg, "the store", [], "give model._target_={}")
    check_targets(cfg, "the store", ["evil.module"], "give model._target_={}")
    check_targets(cfg, "a run folder", [], "pass --model-target {}", calls_algorithm=False)


@pytest.mark.parametrize("overrides, part, target", [
    (("optim=torch", "optim._target_=evil.optimizer"), "optim", "evil.optimizer"),
    (("optim=torch", "optim.scheduler={_target_:evil.scheduler}"), "optim", "evil.scheduler"),
    (("algo=local_sgd", "algo.outer={_target_:torch.optim.sgd.torch.hub.load}"), "algo.outer",
     "torch.optim.sgd.torch.hub.load"),
])
def test_an_optimizer_target_read_back_is_called_only_where_the_user_names_it(
        overrides: tuple[str, ...], part: str, target: str) -> None:
    """torch.optim's own classes, by their public names, are trusted; any other path is not."""
    cfg = run_config(*overrides)
    with pytest.raises(UserError, match=rf"names {re.escape(part)}\._target_ '{re.escape(target)}'"
                                        rf".*add {re.escape(part)}\._target_="):
        check_targets(cfg, "a run folder", [], "pass --model-target {}")
    check_targets(cfg, "a run folder", [target], "pass --model-target {}")
    check_targets(cfg, "a run folder", [], "pass --model-target {}", calls_algorithm=False)


def test_torch_optims_own_optimizers_read_back_are_trusted() -> None:
    cfg = run_config("algo=local_sgd", "optim=torch", "optim._target_=torch.optim.AdamW",
                     "optim.scheduler={_target_:torch.optim.lr_scheduler.CosineAnnealingLR,"
                     "T_max:10}", "algo.outer={_target_:torch.optim.SGD,lr:0.7}")
    check_targets(cfg, "a run folder", [], "pass --model-target {}")
