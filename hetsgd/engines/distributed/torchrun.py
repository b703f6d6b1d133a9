"""Whether torchrun started this process, and as which rank; read from the environment alone
(no torch import), so the command line can ask it before loading the training stack."""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class Torchrun:
    """This process's place in a torchrun launch."""

    rank: int
    world_size: int
    local_rank: int


def torchrun() -> Torchrun | None:
    """The torchrun launch this process belongs to, or None when torchrun did not start it.

    Spawned children inherit the environment, so a rank process started by a torchrun worker
    sees the same launch."""
    env = os.environ
    if "TORCHELASTIC_RUN_ID" not in env or "RANK" not in env:
        return None
    return Torchrun(int(env["RANK"]), int(env["WORLD_SIZE"]), int(env.get("LOCAL_RANK", 0)))


def follower() -> bool:
    """A torchrun rank other than 0: it trains, and rank 0 writes the one run directory."""
    launch = torchrun()
    return launch is not None and launch.rank != 0
