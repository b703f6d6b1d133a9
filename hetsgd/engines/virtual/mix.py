"""How a simulated mix's workers run here: the device profile of each (its group's named device,
a roofline of the run's model on it, else the group's row of the mix's calibration file), and
the threads and float mode their math takes."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch

from hetsgd.config import RunConfig
from hetsgd.engines.common.worker import seeded_global_streams
from hetsgd.engines.denormals import flushed
from hetsgd.engines.virtual.model_cost import ModelCost
from hetsgd.engines.virtual.profiles import (
    DeviceProfile,
    MeasuredProfile,
    RooflineProfile,
    load_calibration,
    named_device,
)
from hetsgd.errors import UserError
from hetsgd.machine import usable_cores
from hetsgd.model.problem import Problem
from hetsgd.model.step import resolved_step
from hetsgd.workers import WorkerSpec


def profiles_for(cfg: RunConfig, specs: list[WorkerSpec], problem: Problem,
                 step: str) -> list[DeviceProfile]:
    """One profile per worker, by rank, costed for the training ``step`` the workers take
    (:func:`hetsgd.engines.hooks.step_choice`: a rank loop may take its own); a group with
    neither a profile nor a calibration row is a one-line UserError."""
    mix = cfg.devices
    measured = load_calibration(Path(mix.calibration)) if mix.calibration is not None else {}
    cost: ModelCost | None = None
    by_group: dict[str, DeviceProfile] = {}
    for group in dict.fromkeys(spec.group for spec in specs):
        name = mix.groups[group].profile
        if name is not None:
            if cost is None:
                cost = ModelCost.of(problem.build_model(cfg.model, cfg.seed),
                                    (problem.num_features,), problem.task, step,
                                    problem.input_dtype)
            by_group[group] = RooflineProfile(named_device(name), cost)
        elif group in measured:
            by_group[group] = measured[group]
            _check_timed_step(cfg, problem, step, group, measured[group])
        else:
            where = (f"devices.calibration={mix.calibration} has no row for it"
                     if mix.calibration is not None else "devices.calibration is not set")
            raise UserError(f"simulated group '{group}' of devices={mix.name} has no device "
                            f"profile: set devices.groups.{group}.profile, or measure it with "
                            f"`hetsgd machine --calibrate` ({where})")
    return [by_group[spec.group] for spec in specs]


def _check_timed_step(cfg: RunConfig, problem: Problem, step: str, group: str,
                      profile: MeasuredProfile) -> None:
    """A one-line UserError where the calibration timed another step than the run's workers
    take: sync's ranks take the autograd step whatever optim.step says, and the fused step a
    default calibration timed is up to twice as fast (simulated sync ran that much too fast)."""
    if profile.step is None:
        return
    taken = resolved_step(problem.build_model(cfg.model, cfg.seed), step, cfg.optim)
    if taken != profile.step:
        raise UserError(f"devices.calibration={cfg.devices.calibration} timed group '{group}' "
                        f"taking the {profile.step} step, and this run's workers take the "
                        f"{taken} step: calibrate with `hetsgd machine --calibrate "
                        f"optim.step={taken} ...`")


def math_threads(specs: list[WorkerSpec]) -> int:
    """The threads the simulated workers' math runs on, in turn: as many as the widest worker
    would use, up to the cores this machine has (a simulated socket's 18 threads on a laptop
    would only oversubscribe it)."""
    return max(1, min(max(spec.threads for spec in specs), usable_cores()))


@contextmanager
def simulated_math(cfg: RunConfig, specs: list[WorkerSpec]) -> Iterator[None]:
    """This process computes the simulated workers' steps meanwhile: on :func:`math_threads`
    threads, flushing denormals as a worker process does (``devices.flush_denormal``), its
    global random streams seeded from the run's seed (a researcher's dropout draws there, one
    stream for every simulated worker); all restored after."""
    threads = torch.get_num_threads()
    torch.set_num_threads(math_threads(specs))
    try:
        with flushed(cfg.devices.flush_denormal), seeded_global_streams(cfg.seed):
            yield
    finally:
        torch.set_num_threads(threads)
