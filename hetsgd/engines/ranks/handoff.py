"""Rank 0 hands what it resolved to the other torchrun ranks, through torchrun's own store.

Composing the config again on every node could resolve differently (``${hetsgd.cores:}``, ``auto``
mixes, a different ``conf/``), so only global rank 0 composes and plans; the other ranks take
its result. The store is the TCPStore torchrun's agent hosts (``TORCHELASTIC_USE_AGENT_STORE``,
torchrun's default); every rank reaches it as a client at ``MASTER_ADDR:MASTER_PORT``. Anyone
who reaches that port can write to it, so the hand-off is JSON, read as data only: never a
pickle, which would run whatever code its writer chose.
"""

from __future__ import annotations

import json
import os
from datetime import timedelta
from typing import Any

import torch.distributed as dist

from hetsgd.errors import UserError

# How long a follower waits for rank 0's hand-off: rank 0 composes and plans first.
HANDOFF_TIMEOUT_S = 300.0


def _store(timeout_s: float) -> dist.TCPStore:
    env = os.environ
    if env.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        raise UserError("hetsgd under torchrun needs the store torchrun's agent hosts: unset "
                        "TORCH_DISABLE_SHARE_RDZV_TCP_STORE")
    return dist.TCPStore(env["MASTER_ADDR"], int(env["MASTER_PORT"]), is_master=False,
                         timeout=timedelta(seconds=timeout_s))


def _key() -> str:
    # A restarted launch must not read the previous attempt's hand-off.
    return f"hetsgd/handoff/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}"


def hand_off(value: dict[str, Any]) -> None:
    """Rank 0: publish ``value`` (plain data: :func:`hetsgd.config.plain.plain`) for every other
    rank."""
    _store(HANDOFF_TIMEOUT_S).set(_key(), json.dumps(value))


def read_handoff(raw: bytes) -> dict[str, Any]:
    """What a follower read from the store, as the mapping rank 0 handed off; anything that is
    not a JSON mapping is a one-line :class:`UserError`."""
    try:
        value = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UserError(f"the hand-off in torchrun's store is not rank 0's (not JSON: {exc}); "
                        "is another program writing to MASTER_PORT?") from exc
    if not isinstance(value, dict):
        raise UserError(f"the hand-off in torchrun's store is not rank 0's (a JSON "
                        f"{type(value).__name__}, not a mapping)")
    return value


def receive() -> dict[str, Any]:
    """A follower: rank 0's hand-off, waiting for it up to ``HANDOFF_TIMEOUT_S``."""
    store = _store(HANDOFF_TIMEOUT_S)
    try:
        raw = store.get(_key())
    except RuntimeError as exc:  # the store's timeout
        raise UserError(f"rank 0 handed over no config within {HANDOFF_TIMEOUT_S:.0f} s: "
                        f"{str(exc).splitlines()[0] if str(exc) else type(exc).__name__}") from exc
    return read_handoff(raw)
