"""Synchronous mini-batch SGD. On one worker it is the single-device baseline: plain SGD on the
master model, in place on a CPU, or resident on a GPU and published for snapshots."""

from __future__ import annotations

from hetsgd.config import RunConfig
from hetsgd.devices import WorkerSpec
from hetsgd.engine import Coordinator, OnTick
from hetsgd.errors import UserError
from hetsgd.shared import Problem, SharedData, SharedMaster


def plan(cfg: RunConfig, specs: list[WorkerSpec]) -> list[WorkerSpec]:
    if len(specs) != 1:
        raise UserError(
            f"algo=sync trains on exactly one worker, but devices={cfg.devices.name} has "
            f"{len(specs)}: use devices=single_cpu or devices=gpu")
    return specs


def coordinator(cfg: RunConfig, specs: list[WorkerSpec], problem: Problem, data: SharedData,
                master: SharedMaster, on_tick: OnTick) -> Coordinator:
    return Coordinator(cfg, specs, problem, data, master, on_tick)
