"""CPU+GPU Hogbatch (Ma & Rusu): host workers take small batches and update the master in place;
accelerator workers take large batches on a replica that is copied in before each batch and merged
back after it (``algo.merge``: ``delta``, the project's default, or ``overwrite``, the authors'
released code). Asynchronous: nobody waits for anybody."""

from __future__ import annotations

from functools import partial

import torch

from hetsgd.algorithms.api import (
    HogbatchConfig,
    Hooks,
    InPlace,
    Link,
    LinkHooks,
    Plan,
    Replica,
    RunConfig,
    SharedState,
    UserError,
    WorkerSpec,
)

NAME = "hogbatch"
CONFIG = HogbatchConfig


def hogbatch_link(spec: WorkerSpec, module: torch.nn.Module, state: SharedState, merge: str,
                  pipelined: bool = True) -> Link:
    """Accelerators train a replica merged back after each batch; host workers step in place."""
    return (Replica(spec, module, state, merge, pipelined) if spec.accel
            else InPlace(spec, module, state))


def check_workers(cfg: RunConfig, specs: list[WorkerSpec]) -> None:
    """The Hogbatch layout: at least one accelerator, and no cuda worker in the host role."""
    if any(s.kind == "cuda" and not s.accel for s in specs):
        raise UserError("a cuda worker cannot update the shared master in place: give cuda groups "
                        "role accel (or auto)")
    if not any(s.accel for s in specs):
        raise UserError(f"algo={cfg.algo.name} needs an accelerator group (role accel), and "
                        f"devices={cfg.devices.name} has none (try devices=auto or devices=emulated)")


def plan(cfg: RunConfig, specs: list[WorkerSpec]) -> Plan:
    check_workers(cfg, specs)
    return Plan(cfg, specs)


def hooks(plan: Plan) -> Hooks:
    algo = plan.cfg.algo
    assert isinstance(algo, HogbatchConfig)
    return LinkHooks(partial(hogbatch_link, merge=algo.merge, pipelined=algo.pipelined))
