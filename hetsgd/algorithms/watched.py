"""A user's algorithm's code as the engines call it (:mod:`.plugin` wraps it so): whatever it
raises or however it exits is one line naming the target, what the coordinator calls is bounded,
and what it reports is checked before it lands in the run's files.

- its controller (:class:`Watched`): each tick bounded by ``workers.stall_s``, as a worker that
  makes no progress is; the batch sizes it sets whole numbers >= 1; its summary entries under
  ``plugin`` (:func:`namespaced`), so that they can never stand for the run's own (``status``,
  ``final``);
- its links (:class:`CheckedLink`): their exits named (an error keeps the file and line a
  worker's report gives it), the seconds each call reports spent copying (workers.csv's
  ``comm_s``) finite, >= 0, and no more than the call took.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from functools import partial
from typing import Any, TypeVar

from hetsgd.bounded import bounded, own_interrupt
from hetsgd.engines.counters import WorkerCounters
from hetsgd.engines.training import Controller
from hetsgd.errors import UserError
from hetsgd.targets import raised

KEY = "algo._target_"
PLUGIN = "plugin"  # summary.json's entry for a user's algorithm's own
# how much longer than a link's call the seconds it reports may be: clock reads around the call
TIMING_MARGIN_S = 1.0
T = TypeVar("T")


def named(target: str, doing: str, exc: BaseException) -> UserError:
    """What the user's code raised while ``doing``, as one line naming the target: its own
    refusal (a :class:`UserError`) after the target, anything else with its type."""
    if isinstance(exc, UserError):
        return UserError(f"{KEY}={target}: {exc}")
    return raised(KEY, target, exc, doing)


@contextmanager
def naming(target: str, doing: str) -> Iterator[None]:
    """What the user's code raises while ``doing``, exits included (a ``KeyboardInterrupt``
    of its own too: not a stop signal that arrived), as one line naming the target."""
    try:
        yield
    except BaseException as exc:  # noqa: BLE001 - the user's code
        if not (isinstance(exc, Exception) or own_interrupt(exc)):
            raise
        raise named(target, doing, exc) from None


def bounded_call(target: str, doing: str, timeout_s: float, call: Callable[[], T]) -> T:
    """``call()`` (the user's ``doing``) run bounded as a model's factory is
    (:func:`hetsgd.bounded.bounded`): within ``timeout_s`` (``workers.stall_s``), its exits,
    ``os._exit`` included, its own."""
    return bounded(call, timeout_s, f"{KEY}={target}: {doing} did not return within "
                   f"workers.stall_s={timeout_s:g} s (raise it if it is only slow)",
                   f"{target}: {doing}", partial(named, target, doing))


def namespaced(target: str, entries: object) -> dict[str, Any]:
    """A user's algorithm's summary entries, under ``plugin``."""
    if not isinstance(entries, Mapping):
        raise UserError(f"{KEY}={target}: its summary entries are a {type(entries).__name__}, "
                        "not a dict")
    return {PLUGIN: {str(key): value for key, value in entries.items()}}


class Watched:
    """A user's controller, as the coordinator calls it (see the module's docstring)."""

    def __init__(self, target: str, controller: Controller, timeout_s: float) -> None:
        self.target, self.controller, self.timeout_s = target, controller, timeout_s
        self.log = controller.log  # rows of batches.csv: the controller's own, as it keeps them

    def tick(self, elapsed: float, counters: WorkerCounters) -> None:
        # only what the tick set is the controller's: a worker that has not started yet still
        # holds 0 in its row until it writes its own batch size
        before = counters.column("batch_size").tolist()
        bounded_call(self.target, "its controller's tick", self.timeout_s,
                     lambda: self.controller.tick(elapsed, counters))
        self.log = self.controller.log
        after = counters.column("batch_size").tolist()
        for rank, (was, size) in enumerate(zip(before, after, strict=True)):
            if size != was and not (size >= 1 and float(size).is_integer()):  # NaN too
                raise UserError(f"{KEY}={self.target}: its controller set worker {rank}'s batch "
                                f"size to {size:g}; a batch size is a whole number >= 1")

    def summary(self) -> dict:
        return namespaced(self.target, bounded_call(self.target, "its controller's summary",
                                                    self.timeout_s, self.controller.summary))


class CheckedLink:
    """A user's link, as a worker calls it (see the module's docstring); its other attributes
    (``flat``, ``COPIES_PER_STEP``) are the link's own."""

    def __init__(self, target: str, worker: str, link: object) -> None:
        self._target, self._worker, self._link = target, worker, link

    def __getattr__(self, name: str) -> Any:
        return getattr(self._link, name)

    def _timed(self, method: str) -> float:
        doing = f"its link's {method} for {self._worker}"
        started = time.perf_counter()
        try:
            seconds = getattr(self._link, method)()
        except BaseException as exc:  # noqa: BLE001 - an error keeps its file and line (the
            if isinstance(exc, Exception) or not own_interrupt(exc):  # worker's report)
                raise
            raise named(self._target, doing, exc) from None
        took = time.perf_counter() - started
        if not (isinstance(seconds, int | float) and math.isfinite(seconds)
                and 0 <= seconds <= took + TIMING_MARGIN_S):
            raise UserError(f"{KEY}={self._target}: {doing} reported {seconds!r} s spent "
                            f"copying; it took {took:.3g} s (a time is finite, >= 0 and within "
                            "the call)")
        return float(seconds)

    def before_step(self) -> float:
        return self._timed("before_step")

    def after_step(self) -> float:
        return self._timed("after_step")

    def publish(self) -> float:
        return self._timed("publish")

    def finish(self) -> float:
        return self._timed("finish")
