"""Whether torchrun started this process, and as which rank; read from the environment alone
(no torch import), so the command line can ask it before loading the training stack."""

from __future__ import annotations

import os
from dataclasses import dataclass

from hetsgd.errors import UserError


@dataclass(frozen=True)
class Torchrun:
    """This process's place in a torchrun launch."""

    rank: int
    world_size: int
    local_rank: int
    nodes: int  # torchrun's agents, one per node
    local_world_size: int  # the ranks on this process's node


def torchrun() -> Torchrun | None:
    """The torchrun launch this process belongs to, or None when torchrun did not start it.

    Spawned children inherit the environment, so a rank process started by a torchrun worker
    sees the same launch."""
    env = os.environ
    if "TORCHELASTIC_RUN_ID" not in env or "RANK" not in env:
        return None
    world_size = int(env["WORLD_SIZE"])
    return Torchrun(int(env["RANK"]), world_size, int(env.get("LOCAL_RANK", 0)),
                    int(env.get("GROUP_WORLD_SIZE", 1)),
                    int(env.get("LOCAL_WORLD_SIZE", world_size)))


def follower() -> bool:
    """A torchrun rank other than 0: it trains, and rank 0 writes the one run directory."""
    launch = torchrun()
    return launch is not None and launch.rank != 0


def check_distributed(algo: str, distributed: bool) -> None:
    """Under a torchrun launch of several ranks, only an algorithm whose workers are
    torch.distributed ranks (``distributed``: its hooks are the distributed engine's) can run:
    an asynchronous one shares one machine's memory, so rank 0 would train alone while the
    other ranks have nothing to join. Every rank refuses it, from the plan, before anything
    trains (rank 0 before it hands the plan over)."""
    launch = torchrun()
    if launch is not None and launch.world_size > 1 and not distributed:
        raise UserError(f"algo={algo} trains its workers in one machine's shared memory, not as "
                        f"torch.distributed ranks: torchrun's {launch.world_size} ranks cannot run "
                        "it; use algo=sync or algo=local_sgd under torchrun, or run it without")
