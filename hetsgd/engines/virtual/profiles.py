"""How long a training step takes on a device, and one copy of the model to or from it: from a
roofline (a named device's spec sheet and the model's counted cost) or from a calibration run's
measurements. The virtual-clock engine advances its clock by these seconds."""

from __future__ import annotations

import bisect
import csv
import io
import itertools
import math
import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Protocol

import yaml

from hetsgd.config.checks import finite
from hetsgd.config.schema import MAX_SLOWDOWN
from hetsgd.data.files import open_data
from hetsgd.engines.virtual.model_cost import ModelCost
from hetsgd.errors import UserError

PROFILES_FILE = Path(__file__).with_name("profiles.yaml")
KINDS = ("cpu", "cuda")
_NUMBERS = ("peak_flops", "memory_bandwidth", "launch_s", "efficiency")
_LINK = ("link_bandwidth", "link_latency_s")
CALIBRATION_COLUMNS = ("group", "batch_size", "ms_per_step", "comm_ms_per_step")
# the steps a calibration's `step` column names (hetsgd.model.step.resolved_step)
TIMED_STEPS = ("fused", "autograd")
# a mix's exchange, where measured: the earliest rank's waits and the exchange's cost at each
# (space-separated, as many of each)
EXCHANGE_COLUMNS = ("exchange_wait_ms", "exchange_ms")
# Plausible bounds of a calibration's values: a device's step takes 1 µs to 1 hour (shorter is
# below the clock's resolution, longer a typo, and either stalls the virtual clock), an exchange's
# waits and costs as long at most; batch sizes are whole, a billion at most. A calibration
# has a row per group and batch size: a file of many more rows is not one.
MIN_STEP_MS, MAX_STEP_MS = 1e-3, 3.6e6
MAX_BATCH = 10**9
MAX_CALIBRATION_ROWS = 10_000
MAX_SHOWN = 40  # characters of a refused value that its error line shows


class DeviceProfile(Protocol):
    """Seconds a worker's device spends on a step and on a copy of the model."""

    @property
    def name(self) -> str:
        """What the summary and logs call this profile."""
        ...

    def compute_s(self, batch_size: int) -> float:
        """Seconds of one training step of ``batch_size`` examples: forward, backward, update."""
        ...

    def copy_s(self) -> float:
        """Seconds of one copy of the model between host and device, one way (0.0 for a host
        CPU core, which steps on the shared model in place)."""
        ...

    def exchange_s(self, wait_s: float) -> float | None:
        """Seconds a round's exchange of the model adds to the slowest rank's step, among the
        ranks of the mix it was measured in (the all-reduce and what the ranks pay around it on
        that machine), when the earliest rank waited ``wait_s`` for the last; None where it is
        not measured (the group then models it from ``copy_s``)."""
        ...


@dataclass(frozen=True)
class RooflineDevice:
    """A device as its spec sheet describes it (``profiles.yaml`` documents each field)."""

    name: str
    kind: str
    peak_flops: float
    memory_bandwidth: float
    launch_s: float
    efficiency: float
    link_bandwidth: float | None  # None for a CPU core
    link_latency_s: float | None
    sources: dict[str, str]  # field -> the spec sheet's URL, or "estimate: <reasoning>"


@cache
def _devices() -> dict[str, RooflineDevice]:
    entries = yaml.safe_load(PROFILES_FILE.read_text())
    return {name: _device(name, entry) for name, entry in entries.items()}


def _device(name: str, entry: dict) -> RooflineDevice:
    """One entry of profiles.yaml, checked: every number present, positive and sourced; a link
    exactly where the device is a GPU."""
    kind = entry.get("kind")
    if kind not in KINDS:
        raise ValueError(f"{PROFILES_FILE}: {name}.kind is {kind!r}, not one of {', '.join(KINDS)}")
    sources = entry.get("sources") or {}
    wanted = _NUMBERS + (_LINK if kind == "cuda" else ())
    for field in wanted:
        value = entry.get(field)
        if not finite(value) or isinstance(value, bool) or value <= 0:
            raise ValueError(f"{PROFILES_FILE}: {name}.{field} must be a positive, finite number, "
                             f"not {value!r}")
        if field not in sources:
            raise ValueError(f"{PROFILES_FILE}: {name}.{field} has no entry under sources")
    if entry["efficiency"] > 1:
        raise ValueError(f"{PROFILES_FILE}: {name}.efficiency is a share of peak_flops, at most 1, "
                         f"not {entry['efficiency']!r}")
    if kind == "cpu" and any(entry.get(field) is not None for field in _LINK):
        raise ValueError(f"{PROFILES_FILE}: {name} is a CPU core; its link fields must be null")
    numbers = {f: float(entry[f]) for f in _NUMBERS}
    cuda = kind == "cuda"
    return RooflineDevice(name=name, kind=kind, **numbers,
                          link_bandwidth=float(entry["link_bandwidth"]) if cuda else None,
                          link_latency_s=float(entry["link_latency_s"]) if cuda else None,
                          sources=dict(sources))


def device_names() -> tuple[str, ...]:
    """The named devices, in the order profiles.yaml lists them."""
    return tuple(_devices())


def named_device(name: str) -> RooflineDevice:
    devices = _devices()
    if name not in devices:
        raise UserError(f"unknown device profile {name!r}: one of {', '.join(devices)}")
    return devices[name]


@dataclass(frozen=True)
class RooflineProfile:
    """A step's time from first principles: a fixed cost per operator call, then the slower of
    the arithmetic at the device's achievable rate and the memory traffic at its bandwidth."""

    device: RooflineDevice
    cost: ModelCost

    @property
    def name(self) -> str:
        return self.device.name

    def compute_s(self, batch_size: int) -> float:
        _check_batch(batch_size)
        device, cost = self.device, self.cost
        flops = batch_size * cost.flops_per_example + cost.update_flops
        traffic = batch_size * cost.bytes_per_example + cost.bytes_per_step
        return cost.kernels_per_step * device.launch_s + max(
            flops / (device.peak_flops * device.efficiency), traffic / device.memory_bandwidth)

    def copy_s(self) -> float:
        device = self.device
        if device.link_bandwidth is None or device.link_latency_s is None:  # a CPU core
            return 0.0
        return device.link_latency_s + self.cost.param_bytes / device.link_bandwidth

    def exchange_s(self, wait_s: float) -> float | None:
        return None


@dataclass(frozen=True)
class ExchangeCost:
    """A mix's exchange as a calibration measured it, at a few waits of the earliest rank
    (strictly ascending): a rank that waited longer in a collective can wake later (an idle core
    or vCPU), so the cost is interpolated in the wait between the measured points, and flat
    outside them."""

    waits_s: tuple[float, ...]
    seconds: tuple[float, ...]

    @classmethod
    def of(cls, points: Iterable[tuple[float, float]]) -> ExchangeCost:
        """From (wait, seconds) points in any order; points at one wait (ranks of one speed
        wait about as little in every pattern) count as their mean."""
        by_wait: dict[float, list[float]] = {}
        for wait, seconds in sorted(points):
            by_wait.setdefault(wait, []).append(seconds)
        if not by_wait:
            raise ValueError("no points")
        return cls(tuple(by_wait), tuple(statistics.fmean(s) for s in by_wait.values()))

    def __call__(self, wait_s: float) -> float:
        waits, seconds = self.waits_s, self.seconds
        if wait_s <= waits[0]:
            return seconds[0]
        if wait_s >= waits[-1]:
            return seconds[-1]
        i = bisect.bisect_right(waits, wait_s)
        share = (wait_s - waits[i - 1]) / (waits[i] - waits[i - 1])
        return (1 - share) * seconds[i - 1] + share * seconds[i]


@dataclass(frozen=True)
class MeasuredProfile:
    """A step's time as a calibration measured it (``hetsgd machine --calibrate``), its copies
    taken out: the measured batch sizes, ascending, and each one's seconds of compute."""

    name: str
    batch_sizes: tuple[int, ...]
    compute_seconds: tuple[float, ...]
    copy_seconds: float
    exchange: ExchangeCost | None = None  # the mix's exchange of the model, where measured
    # the training step it timed (fused or autograd); None in a file from before calibrations
    # said, whose steps were the run's optim.step (fused where the model allows it)
    step: str | None = None

    def compute_s(self, batch_size: int) -> float:
        """Straight lines in log(batch) vs log(seconds) between measured sizes: a step's time
        goes from flat (fixed costs) to proportional (throughput), and a power law follows that
        bend between neighbours. Past the largest size a step is throughput bound: time grows in
        proportion, at the largest size's seconds per example. Below the smallest, the fixed
        costs that dominate it remain: a smaller batch takes as long."""
        _check_batch(batch_size)
        sizes, seconds = self.batch_sizes, self.compute_seconds
        if batch_size >= sizes[-1]:
            return seconds[-1] * batch_size / sizes[-1]
        if batch_size <= sizes[0]:
            return seconds[0]
        i = bisect.bisect_right(sizes, batch_size)
        share = math.log(batch_size / sizes[i - 1]) / math.log(sizes[i] / sizes[i - 1])
        return math.exp((1 - share) * math.log(seconds[i - 1]) + share * math.log(seconds[i]))

    def copy_s(self) -> float:
        return self.copy_seconds

    def exchange_s(self, wait_s: float) -> float | None:
        return None if self.exchange is None else self.exchange(wait_s)


def load_calibration(path: Path) -> dict[str, MeasuredProfile]:
    """A calibration CSV (``hetsgd machine --calibrate``) as one profile per worker group."""
    path = Path(path)
    source = f"calibration file {path}"
    try:
        with open_data(path, decompress=False, text=True) as raw:
            reader = csv.DictReader(io.TextIOWrapper(raw, encoding="utf-8-sig", newline=""))
            if reader.fieldnames is None:
                raise UserError(f"{source} is empty (measure one with `hetsgd machine --calibrate`)")
            missing = [c for c in CALIBRATION_COLUMNS if c not in reader.fieldnames]
            if missing:
                raise UserError(f"{source} lacks the columns {', '.join(missing)}"
                                " (measure again with `hetsgd machine --calibrate`)")
            rows = list(itertools.islice(reader, MAX_CALIBRATION_ROWS + 1))
    except (UnicodeDecodeError, csv.Error) as exc:
        raise UserError(f"cannot read {source}: not a CSV text file ({exc})") from exc
    if len(rows) > MAX_CALIBRATION_ROWS:
        raise UserError(f"{source} has more than {MAX_CALIBRATION_ROWS:,} rows: not a calibration")
    return measured_profiles(rows, source)


def measured_profiles(rows: list[dict], source: str) -> dict[str, MeasuredProfile]:
    """A calibration's rows (as read from its CSV, or as measured) as one profile per group,
    every value range-checked: a value out of range is one line naming the row, its group, the
    column and the value. A group's copy time is half a step's median comm time: a replica
    copies in before the batch and out after it."""
    if not rows:
        raise UserError(f"{source} has no rows")
    groups: dict[str, dict[int, tuple[float, float]]] = {}
    exchange: dict[str, ExchangeCost] = {}
    steps: dict[str, str | None] = {}
    for line, row in enumerate(rows, start=2):
        where = f"{source}, line {line}"
        group = row.get("group")
        if not isinstance(group, str) or not group.strip():
            raise UserError(f"{where}: {_refused('group', group, 'the name of a group of the mix')}")
        where += f" (group {group!r})"
        batch = int(_number(row, "batch_size", where, "a whole number of examples", 1, MAX_BATCH,
                            whole=True))
        slowdown = _number(row, "slowdown", where, "an emulated group's slowdown", 1,
                           MAX_SLOWDOWN, default=1.0)
        # an emulated group's measured step includes its sleep, (slowdown - 1) x the step
        step_ms = _number(row, "ms_per_step", where, "a device's step of 1 µs to 1 hour, times "
                          f"slowdown {slowdown:g}", MIN_STEP_MS * slowdown,
                          MAX_STEP_MS * slowdown) / slowdown
        comm_ms = _number(row, "comm_ms_per_step", where, "the step's copies, a part of "
                          "ms_per_step / slowdown that leaves 1 µs of compute", 0,
                          step_ms - MIN_STEP_MS)
        try:
            if (cost := exchange_cost(row)) is not None:
                exchange[group] = cost
        except ValueError as exc:
            raise UserError(f"{where}: {exc}") from None
        measured = groups.setdefault(group, {})
        if batch in measured:
            raise UserError(f"{where}: batch_size={batch} is not allowed: the group has a row "
                            "for it already")
        measured[batch] = (step_ms / 1000, comm_ms / 1000)
        step = row.get("step") or None
        if step not in (None, *TIMED_STEPS) or steps.setdefault(group, step) != step:
            allowed = f"one of {', '.join(TIMED_STEPS)}, the same in every row of the group"
            raise UserError(f"{where}: {_refused('step', step, allowed)}")
    return {group: _measured(group, measured, exchange.get(group), steps.get(group))
            for group, measured in groups.items()}


def _refused(column: str, raw: object, allowed: str) -> str:
    """What refuses a row's value, the value as read, on one line and short."""
    if raw in (None, ""):
        return f"{column} is empty, and must be {allowed}"
    text = str(raw)
    shown = text if text.isprintable() else repr(text)
    shown = shown if len(shown) <= MAX_SHOWN else shown[:MAX_SHOWN] + "..."
    return f"{column}={shown} is not allowed: {allowed}"


def _number(row: Mapping[str, object], column: str, where: str, what: str, low: float,
            high: float, default: float | None = None, whole: bool = False) -> float:
    """A row's number in ``column``, from ``low`` to ``high`` (``default`` where it is empty
    and has one): a NaN fails the bounds, and a text that is no number reads as NaN."""
    raw = row.get(column)
    if raw in (None, "") and default is not None:
        return default
    try:
        value = float(raw)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        value = math.nan
    if not (low <= value <= high and (value.is_integer() or not whole)):
        raise UserError(f"{where}: {_refused(column, raw, f'{what} ({low:g} to {high:g})')}")
    return value


def exchange_cost(row: Mapping[str, object]) -> ExchangeCost | None:
    """A calibration row's exchange columns (numbers, or space-separated numbers, in ms, waits
    ascending, as many of each), or None where the row has neither (a one-worker mix). A value
    out of range is a ValueError naming its column and value."""
    raw = {c: "" if row.get(c) is None else str(row[c]).strip() for c in EXCHANGE_COLUMNS}
    if not any(raw.values()):
        return None
    waits, costs = (_exchange_ms(c, raw[c]) for c in EXCHANGE_COLUMNS)
    if len(waits) != len(costs) or not waits:
        raise ValueError(f"wants {' and '.join(EXCHANGE_COLUMNS)} as many numbers each, not "
                         f"{len(waits)} and {len(costs)}")
    if waits != sorted(waits):
        raise ValueError(_refused("exchange_wait_ms", raw["exchange_wait_ms"],
                                  "waits in ascending order"))
    return ExchangeCost.of((w / 1000, c / 1000) for w, c in zip(waits, costs))


def _exchange_ms(column: str, text: str) -> list[float]:
    """One exchange column's numbers, each a finite, non-negative number of ms."""
    values = []
    for word in text.split():
        try:
            values.append(float(word))
        except ValueError:
            values.append(math.nan)
    if not all(0 <= v <= MAX_STEP_MS for v in values):
        raise ValueError(_refused(column, text, f"numbers of ms (0 to {MAX_STEP_MS:g})"))
    return values


def _measured(group: str, measured: dict[int, tuple[float, float]],
              exchange: ExchangeCost | None, step: str | None) -> MeasuredProfile:
    sizes = sorted(measured)
    return MeasuredProfile(f"measured:{group}", tuple(sizes),
                           tuple(measured[b][0] - measured[b][1] for b in sizes),
                           statistics.median(comm for _, comm in measured.values()) / 2,
                           exchange, step)


def _check_batch(batch_size: int) -> None:
    if batch_size < 1:
        raise ValueError(f"a step takes at least one example, not {batch_size}")
