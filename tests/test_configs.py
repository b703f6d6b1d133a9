"""Every choice of every config group, and every job of every experiment, composes into a checked
config that its algorithm can plan (as lightning-hydra-template's tests/test_configs.py does:
Hydra's compose API, nothing trained)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from hydra import compose
from test_sweeps import hydra_conf  # noqa: F401 - the fixture: Hydra on the config tree

from hetsgd import algorithms
from hetsgd.config import CONF_DIR, RunConfig, to_run_config
from hetsgd.config.algorithms import ALGO_SCHEMAS
from hetsgd.config.compose import sweep_jobs
from hetsgd.errors import UserError
from hetsgd.workers import expand

# what a choice needs besides itself to make a run (a custom algorithm names its target; a
# dataset read from the user's files names them)
NEEDS = {("algo", "custom"): ["algo._target_=hetsgd.algorithms.hogwild"],
         ("model", "custom"): ["model._target_=torch.nn.Identity"]}
GROUPS = ["algo", "dataset", "devices", "model", "optim", "logger", "method"]


def _choices(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml"))


def _checked(overrides: list[str]) -> RunConfig:
    cfg = to_run_config(compose("config", overrides=["progress=false", *overrides]))
    assert isinstance(cfg, RunConfig)
    return cfg


def _planned(cfg: RunConfig) -> None:
    """The run's algorithm plans its mix: the layout a choice brings is one it can run (a mix
    this machine cannot build, such as GPUs here, is a one-line refusal of its own)."""
    try:
        specs = expand(cfg.devices)
    except UserError as refused:
        assert "\n" not in str(refused)
        # only for the GPUs or the memory this machine lacks, which a simulated mix needs not
        assert not cfg.devices.simulated, refused
        assert "CUDA GPU" in str(refused) or "of memory is available here" in str(refused)
        return
    algorithm, cfg = algorithms.choose(cfg)
    assert algorithm.plan(cfg, specs).workers


@pytest.mark.usefixtures("hydra_conf")
@pytest.mark.parametrize("group, choice", [(g, c) for g in GROUPS for c in _choices(g)])
def test_every_choice_of_every_group_composes(group: str, choice: str) -> None:
    key = f"+{group}" if group == "method" else group  # a method is added, not chosen
    cfg = _checked([f"{key}={choice}", *NEEDS.get((group, choice), [])])
    if group != "dataset":  # a dataset's data is not loaded here
        _planned(cfg)


@pytest.mark.wall  # composes tens of jobs each: about a minute an experiment on a busy 2-core VM
@pytest.mark.usefixtures("hydra_conf")
@pytest.mark.parametrize("experiment", _choices("experiment"))
def test_every_job_of_every_experiment_composes_and_plans(experiment: str) -> None:
    jobs = sweep_jobs([f"+experiment={experiment}"])
    assert jobs
    # a tuned comparison's jobs are started with its search taken out (hetsgd/tuning/phases.py)
    tuned = ["tuning=null"] if experiment == "tuned_comparison" else []
    seen: set[tuple[str, ...]] = set()
    for job in jobs:
        shape = tuple(o for o in job if not o.startswith("seed="))  # seeds compose alike
        if shape in seen:
            continue
        seen.add(shape)
        _planned(_checked([*job, *tuned]))


#: Each composition's device mix as the tree composed it when algo YAMLs chose mixes themselves
#: (before each algorithm declared its own: ``AlgoConfig.DEVICES``): every algo choice alone,
#: with `devices=`, with each `+method=`; every method alone and with `devices=`; every
#: experiment's jobs.
BEFORE: dict[str, str] = json.loads(
    (Path(__file__).parent / "assets" / "devices_before.json").read_text())["devices"]


def _devices_choice(overrides: list[str]) -> str:
    """The ``devices`` group's choice that ``overrides`` compose, or ERROR where they do not."""
    try:
        config = compose("config", overrides=overrides, return_hydra_config=True)
    except Exception:  # noqa: BLE001 - a combination that never composed (a method's keys)
        return "ERROR"
    return str(config.hydra.runtime.choices.devices)


@pytest.mark.usefixtures("hydra_conf")
@pytest.mark.parametrize("overrides", sorted(k for k in BEFORE if "+experiment=" not in k))
def test_every_algo_and_method_composes_the_mix_it_did(overrides: str) -> None:
    """An algorithm's own mix, `devices=` over it, a method's over it: as before."""
    assert _devices_choice(overrides.split()) == BEFORE[overrides]


@pytest.mark.wall  # tens of compositions
@pytest.mark.usefixtures("hydra_conf")
def test_every_experiment_job_composes_the_mix_it_did() -> None:
    jobs = sorted(k for k in BEFORE if "+experiment=" in k)
    assert len(jobs) > len(_choices("experiment"))  # the sweeps' jobs, not only the experiments
    assert {job: _devices_choice(job.split()) for job in jobs} == {job: BEFORE[job] for job in jobs}


@pytest.mark.usefixtures("hydra_conf")
@pytest.mark.parametrize("name", sorted(ALGO_SCHEMAS))
def test_an_algorithm_runs_on_the_mix_it_declares(name: str) -> None:
    """``DEVICES`` is the one place an algorithm picks a mix; none declared: config.yaml's."""
    declared = ALGO_SCHEMAS[name].DEVICES
    assert _devices_choice([f"algo={name}", *NEEDS.get(("algo", name), [])]) == (
        declared or "single_cpu")
    defaults = yaml.safe_load((CONF_DIR / "algo" / f"{name}.yaml").read_text())["defaults"]
    assert not [entry for entry in defaults if "devices" in str(entry)]  # the YAML picks none


@pytest.mark.parametrize("algo", ["sync", "local_sgd"])
def test_a_config_dir_mix_is_rebuilt_with_its_own_groups_alone(algo: str) -> None:
    """A mix of a user's --config-dir (groups big and small) is not in hetsgd's config: the
    rebuild composes the default mix, whose groups must not join the recorded ones (they were
    refused as 'not in struct', or would have added workers); local SGD's tau per group too."""
    from conftest import compose_config
    from omegaconf import OmegaConf

    from hetsgd.config.compose import rebuild_config

    recorded = OmegaConf.to_container(compose_config(f"algo={algo}", "devices=emulated"))
    assert isinstance(recorded, dict)
    groups = recorded["devices"]["groups"]
    recorded["devices"].update(name="box", groups={"big": groups["accel"],
                                                   "small": groups["cpu"]})
    if algo == "local_sgd":
        recorded["algo"]["tau"] = {"big": 3, "small": 1}
    config, run = rebuild_config(OmegaConf.create(recorded), [f"algo={algo}", "devices=box"],
                                 "cannot rebuild")
    assert list(run.devices.groups) == list(config.devices.groups) == ["big", "small"]
    assert run.devices.groups["big"].batch_size == groups["accel"]["batch_size"]
    if algo == "local_sgd":
        assert OmegaConf.to_container(config.algo.tau) == {"big": 3, "small": 1}
