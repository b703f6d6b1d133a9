"""CPU+GPU Hogbatch (Ma & Rusu): host workers take small batches and update the master in place;
accelerator workers take large batches on a replica that is copied in before each batch and merged
back after it (``algo.merge``: ``delta``, the project's default, or ``overwrite``, the authors'
released code). Asynchronous: nobody waits for anybody."""

from __future__ import annotations

from functools import partial

import torch

from hetsgd.config import RunConfig
from hetsgd.devices import WorkerSpec
from hetsgd.engine import Coordinator, OnTick
from hetsgd.errors import UserError
from hetsgd.shared import Problem, SharedData, SharedMaster, SharedState
from hetsgd.workers import InPlace, Link, Replica, worker_process


def hogbatch_link(spec: WorkerSpec, module: torch.nn.Module, state: SharedState, merge: str) -> Link:
    return Replica(module, state, merge) if spec.accel else InPlace(module, state)


def plan(cfg: RunConfig, specs: list[WorkerSpec]) -> list[WorkerSpec]:
    if any(s.kind == "cuda" and not s.accel for s in specs):
        raise UserError("a cuda worker cannot update the shared master in place: give cuda groups "
                        "role accel (or auto)")
    if not any(s.accel for s in specs):
        raise UserError(f"algo={cfg.algo.name} needs an accelerator group (role accel), and "
                        f"devices={cfg.devices.name} has none (try devices=auto or devices=emulated)")
    return specs


def coordinator(cfg: RunConfig, specs: list[WorkerSpec], problem: Problem, data: SharedData,
                master: SharedMaster, on_tick: OnTick, controller=None) -> Coordinator:
    target = partial(worker_process, link_factory=partial(hogbatch_link, merge=cfg.algo.merge))
    return Coordinator(cfg, specs, problem, data, master, on_tick, target=target,
                       controller=controller)
