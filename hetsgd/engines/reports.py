"""How a worker or rank process keeps its coordinator informed, the one protocol both process
engines share: reports on the coordinator's queue and, while it sets up, a heartbeat.

A report is ``(topic, rank, message)``: ``ready`` (set up, waiting for the clock), ``checkpoint``
(its part of a checkpoint, as bytes), then exactly one end: ``done``, ``diverged`` or ``failed``
(with why). The coordinator reads them (``Coordinator._collect``); a process that dies without
its end counts as failed there.
"""

from __future__ import annotations

import threading
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Protocol

from hetsgd.engines.checkpoint import WorkerState
from hetsgd.engines.common.state import SharedState
from hetsgd.errors import Diverged, UserError, one_line, out_of_memory

SETUP_BEAT_S = 0.2  # how often a worker that sets up beats its heartbeat (see `beating`)
Report = tuple[str, int, str | bytes]  # (topic, rank, message)


class Reports(Protocol):
    """Where reports go: the coordinator's queue (a rank that follows under torchrun keeps its
    own, to print its end)."""

    def put(self, report: Report, /) -> None: ...


def send_ready(reports: Reports, rank: int) -> None:
    """Set up: the coordinator starts the clock once every process has said so."""
    reports.put(("ready", rank, ""))


def send_checkpoint(reports: Reports, rank: int, part: WorkerState) -> None:
    """A worker's part of a checkpoint, to its coordinator (which assembles and writes it)."""
    reports.put(("checkpoint", rank, part.to_bytes()))


@contextmanager
def beating(state: SharedState, rank: int) -> Iterator[None]:
    """While a worker sets up, a thread beats its heartbeat: setup is a few long calls (a CUDA
    context, staging the data, a rendezvous) with no step to count, and a worker stopped there
    then shows within its stall window. A call that hangs is left to the startup timeout (the
    thread beats on); once training starts, only the worker's own loop beats."""
    done = threading.Event()

    def beat() -> None:
        while not done.wait(SETUP_BEAT_S):
            state.signals.beat(rank)

    thread = threading.Thread(target=beat, name=f"hetsgd-beat-{rank}", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()


@contextmanager
def reporting(rank: int, state: SharedState, reports: Reports) -> Iterator[None]:
    """Report how a worker process's body ended: done, diverged or failed (with the traceback;
    a UserError, such as a setting that does not fit the data, with its one line only).
    Anything is reported, so the coordinator never waits on a dead worker; a failure also stops
    the others."""
    try:
        yield
        state.signals.retire(rank)
        reports.put(("done", rank, ""))
    except Diverged as exc:
        state.signals.retire(rank)
        state.signals.stop.set()
        reports.put(("diverged", rank, str(exc)))
    except UserError as exc:
        state.signals.retire(rank)
        state.signals.stop.set()
        reports.put(("failed", rank, str(exc)))
    except BaseException as exc:  # noqa: BLE001 - reported, not swallowed
        state.signals.retire(rank)
        state.signals.stop.set()
        reports.put(("failed", rank, out_of_memory(exc) or _failure(exc)))


def _failure(exc: BaseException) -> str:
    """Why a process failed: one line, naming where the innermost frame raised it (so that a
    user's model, link or rank loop names its own file), then the traceback (error.log's)."""
    frames = traceback.extract_tb(exc.__traceback__)
    where = (f" (raised at {frames[-1].filename}:{frames[-1].lineno}, in {frames[-1].name})"
             if frames else "")
    return f"{type(exc).__name__}: {one_line(exc)}{where}\n{traceback.format_exc()}"
