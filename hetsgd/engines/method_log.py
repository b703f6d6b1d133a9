"""A method's own numbers (``log(name, value)``): the latest value under each name, in shared
memory, read by the engine at each snapshot.

A value travels as the counters do, not as a message: a table of named slots that any worker
process (or thread) writes and the coordinator reads when it copies the master, so a method may
log every step at the cost of a store, nothing queues up, and each snapshot carries the last
value logged before it (``convergence.csv``'s column of that name; summary.json's
``method_log``: the last of all; the trackers' ``method/<name>`` series). A name takes its slot
under a lock the first time it is logged, and keeps it for the run.

Rank loops log through :meth:`~hetsgd.engines.ranks.loop.RankLoop.log`; a link or a
controller of the asynchronous engine through :func:`log`, bound to the running engine's table
in each process that runs the method's code (the coordinator's, each worker's).
"""

from __future__ import annotations

import math
import numbers
import re
import threading
from dataclasses import dataclass, field
from multiprocessing.synchronize import Lock

import torch

from hetsgd.errors import UserError

MAX_NAMES = 32  # names a run may log
NAME_BYTES = 64  # a name's room in the table, in bytes (ASCII)
NAME = re.compile(rf"[A-Za-z_][A-Za-z0-9_]{{0,{NAME_BYTES - 1}}}")
#: convergence.csv's own columns (and ``updates_<group>``), which a logged name may not take
BUILT_IN_COLUMNS = frozenset({"time_s", "epoch", "updates", "train_loss", "test_loss",
                              "test_acc"})


def check_name(name: object) -> str:
    """``name`` as a convergence column of its own, or a one-line :class:`UserError`."""
    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise UserError(f"log(): name {name!r} is not an identifier of at most {NAME_BYTES} "
                        "ASCII letters, digits and underscores (not starting with a digit)")
    if name in BUILT_IN_COLUMNS or name.startswith("updates_"):
        raise UserError(f"log(): name {name!r} is one of convergence.csv's own columns "
                        f"({', '.join(sorted(BUILT_IN_COLUMNS))}, updates_<group>): choose another")
    return name


def check_value(name: str, value: object) -> float:
    """``value`` as a finite float (a number or a one-element tensor), or a one-line
    :class:`UserError`."""
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise UserError(f"log({name!r}): {type(value).__name__} is not a number (a float, an "
                        "int or a one-element tensor)")
    number = float(value)
    if not math.isfinite(number):
        raise UserError(f"log({name!r}): the value {number} is not finite")
    return number


@dataclass
class MethodLog:
    """The table of logged names and their latest values, shared by the engine's processes or
    threads (``lock`` from the engine's context, as the cursor's)."""

    lock: Lock | threading.Lock
    names: torch.Tensor = field(default_factory=lambda: torch.zeros(
        MAX_NAMES, NAME_BYTES, dtype=torch.uint8).share_memory_())
    values: torch.Tensor = field(default_factory=lambda: torch.full(
        (MAX_NAMES,), math.nan, dtype=torch.float64).share_memory_())
    slots: dict[str, int] = field(default_factory=dict)  # this process's names found so far

    def log(self, name: str, value: object) -> None:
        """Keep ``value`` as the latest under ``name`` (both checked: one line if not)."""
        slot = self.slots.get(name)
        if slot is None:
            slot = self.slots[name] = self._slot(check_name(name))
        self.values[slot] = check_value(name, value)

    def _slot(self, name: str) -> int:
        encoded = torch.tensor(list(name.encode().ljust(NAME_BYTES, b"\0")), dtype=torch.uint8)
        with self.lock:
            for slot in range(MAX_NAMES):
                if self.names[slot, 0] == 0:
                    self.names[slot] = encoded
                    return slot
                if torch.equal(self.names[slot], encoded):
                    return slot
        raise UserError(f"log({name!r}): a run may log at most {MAX_NAMES} names")

    def latest(self) -> dict[str, float]:
        """Every name logged so far and its latest value, in the order first logged."""
        latest = {}
        for row, value in zip(self.names.tolist(), self.values.tolist()):
            if row[0] == 0:
                break
            if not math.isnan(value):  # named, its first value not yet written
                latest[bytes(row).rstrip(b"\0").decode()] = value
        return latest


_bound: MethodLog | None = None  # the running engine's table, in this process


def bind(table: MethodLog) -> None:
    """Make :func:`log` write into ``table``: each engine binds its own as it is built, each
    worker process its run's as it starts."""
    global _bound
    _bound = table


def log(name: str, value: object) -> None:
    """Log a method's own number from its code that runs while the engine trains (a link, a
    controller); a rank loop has :meth:`~hetsgd.engines.ranks.loop.RankLoop.log`."""
    if _bound is None:
        raise UserError(f"log({name!r}): no run is training in this process")
    _bound.log(name, value)
