"""Denormal floats flushed to zero where a run's math runs on the CPU (``devices.flush_denormal``).

A float32 of magnitude below 1.2e-38 is denormal, and x86 CPUs compute with one far slower than
with a normal float (a microcode assist per operation). The Hogbatch authors' net
(``model=mlp_paper``: eight sigmoid layers of 512, no bias) saturates as it trains, and the
tails of its sigmoids' outputs and gradients fall into that range; docs/how_it_works.md has what
that costs on this project's machine. Flushing (torch's ``set_flush_denormal``: the CPU's
flush-to-zero and denormals-are-zero modes) reads every such value as 0, which moves a loss by
far less than a float32 rounding of it does.

The mode is a register of each thread, which a thread inherits from the thread that starts it.
A worker or rank process sets it first thing, before torch starts its intra-op threads; an
engine that computes in this process sets it for training and restores it after, so the threads
it starts (simulated ranks) inherit it, but an intra-op pool started earlier keeps its own.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

DENORMAL = 1e-40  # a float32 denormal: what a flushing thread reads as 0


def flush_denormals(on: bool) -> bool:
    """Set this thread's mode; False where the CPU has none to set (it then computes as is)."""
    return bool(torch.set_flush_denormal(on))


def flushing() -> bool:
    """Whether this thread flushes denormals now (torch has no getter: one is computed)."""
    return bool(torch.tensor(DENORMAL, dtype=torch.float32) * 1.0 == 0.0)


@contextmanager
def flushed(on: bool) -> Iterator[None]:
    """This thread in mode ``on`` meanwhile, its mode before restored after."""
    before = flushing()
    flush_denormals(on)
    try:
        yield
    finally:
        flush_denormals(before)
