"""Hogwild: CPU-only asynchronous SGD, every worker updating the shared master in place, lock-free
(the "CPU" baseline of Ma & Rusu). On a mix with an accelerator group, only the host groups train;
the accelerator (or its emulated stand-in) stays idle, so the same mix serves every algorithm."""

from __future__ import annotations

import logging

from hetsgd.algorithms.api import (
    HogwildConfig,
    Hooks,
    LinkHooks,
    Plan,
    RunConfig,
    UserError,
    WorkerSpec,
    default_link,
    renumber,
)

NAME = "hogwild"
CONFIG = HogwildConfig
log = logging.getLogger("hetsgd")


def plan(cfg: RunConfig, specs: list[WorkerSpec]) -> Plan:
    host = [s for s in specs if not s.accel and s.kind == "cpu"]
    if not host:
        raise UserError(f"algo=hogwild needs CPU host workers, and devices={cfg.devices.name} has none "
                        "(try devices=cpu)")
    if len(host) < len(specs):
        log.info("hogwild trains on the host group(s) only; %d accelerator worker(s) stay idle",
                 len(specs) - len(host))
    return Plan(cfg, renumber(host))


def hooks(plan: Plan) -> Hooks:
    return LinkHooks(default_link)
