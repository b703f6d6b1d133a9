"""How long a training step takes on a device, and one copy of the model to or from it: from a
roofline (a named device's spec sheet and the model's counted cost) or from a calibration run's
measurements. The virtual-clock engine advances its clock by these seconds."""

from __future__ import annotations

import bisect
import csv
import math
import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Protocol

import yaml

from hetsgd.engines.virtual.model_cost import ModelCost
from hetsgd.errors import UserError

DEVICES_FILE = Path(__file__).with_name("devices.yaml")
KINDS = ("cpu", "cuda")
_NUMBERS = ("peak_flops", "memory_bandwidth", "launch_s", "efficiency")
_LINK = ("link_bandwidth", "link_latency_s")
CALIBRATION_COLUMNS = ("group", "batch_size", "ms_per_step", "comm_ms_per_step")
# a mix's exchange, where measured: the earliest rank's waits and the exchange's cost at each
# (space-separated, as many of each)
EXCHANGE_COLUMNS = ("exchange_wait_ms", "exchange_ms")


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
    """A device as its spec sheet describes it (``devices.yaml`` documents each field)."""

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
    entries = yaml.safe_load(DEVICES_FILE.read_text())
    return {name: _device(name, entry) for name, entry in entries.items()}


def _device(name: str, entry: dict) -> RooflineDevice:
    """One entry of devices.yaml, checked: every number present, positive and sourced; a link
    exactly where the device is a GPU."""
    kind = entry.get("kind")
    if kind not in KINDS:
        raise ValueError(f"{DEVICES_FILE}: {name}.kind is {kind!r}, not one of {', '.join(KINDS)}")
    sources = entry.get("sources") or {}
    wanted = _NUMBERS + (_LINK if kind == "cuda" else ())
    for field in wanted:
        value = entry.get(field)
        if not isinstance(value, (int, float)) or value <= 0:
            raise ValueError(f"{DEVICES_FILE}: {name}.{field} must be a positive number, not {value!r}")
        if field not in sources:
            raise ValueError(f"{DEVICES_FILE}: {name}.{field} has no entry under sources")
    if kind == "cpu" and any(entry.get(field) is not None for field in _LINK):
        raise ValueError(f"{DEVICES_FILE}: {name} is a CPU core; its link fields must be null")
    link = {f: float(entry[f]) if kind == "cuda" else None for f in _LINK}
    return RooflineDevice(name=name, kind=kind, **{f: float(entry[f]) for f in _NUMBERS}, **link,
                          sources=dict(sources))


def device_names() -> tuple[str, ...]:
    """The named devices, in the order devices.yaml lists them."""
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
    """A step's time as a calibration measured it (``hetsgd devices --calibrate``), its copies
    taken out: the measured batch sizes, ascending, and each one's seconds of compute."""

    name: str
    batch_sizes: tuple[int, ...]
    compute_seconds: tuple[float, ...]
    copy_seconds: float
    exchange: ExchangeCost | None = None  # the mix's exchange of the model, where measured

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
    """A calibration CSV (``hetsgd devices --calibrate``) as one profile per worker group."""
    path = Path(path)
    try:
        with path.open(newline="") as file:
            reader = csv.DictReader(file)
            missing = [c for c in CALIBRATION_COLUMNS if c not in (reader.fieldnames or [])]
            if missing:
                raise UserError(f"calibration file {path} lacks the columns {', '.join(missing)}"
                                " (measure again with `hetsgd devices --calibrate`)")
            rows = list(reader)
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        reason = exc.strerror if isinstance(exc, OSError) else "not a CSV text file"
        raise UserError(f"cannot read calibration file {path}: {reason}") from exc
    return measured_profiles(rows, f"calibration file {path}")


def measured_profiles(rows: list[dict], source: str) -> dict[str, MeasuredProfile]:
    """A calibration's rows (as read from its CSV, or as measured) as one profile per group.
    A group's copy time is half a step's median comm time: a replica copies in before the
    batch and out after it."""
    if not rows:
        raise UserError(f"{source} has no rows")
    groups: dict[str, dict[int, tuple[float, float]]] = {}
    exchange: dict[str, ExchangeCost] = {}
    for line, row in enumerate(rows, start=2):
        try:
            batch = int(row["batch_size"])
            step_ms, comm_ms = float(row["ms_per_step"]), float(row["comm_ms_per_step"])
            slowdown = float(row.get("slowdown") or 1.0)
            if (cost := exchange_cost(row)) is not None:
                exchange[row["group"]] = cost
        except (TypeError, ValueError):
            raise UserError(f"{source}, line {line}: batch_size, ms_per_step, comm_ms_per_step "
                            f"and slowdown must be numbers, {' and '.join(EXCHANGE_COLUMNS)} as "
                            "many numbers each") from None
        # an emulated group's measured step includes its sleep, (slowdown - 1) x the step
        step_ms /= slowdown if slowdown >= 1 else math.nan
        if batch < 1 or not 0 <= comm_ms < step_ms:
            raise UserError(f"{source}, line {line}: wants batch_size >= 1, "
                            "slowdown >= 1 and 0 <= comm_ms_per_step < ms_per_step / slowdown")
        measured = groups.setdefault(row["group"], {})
        if batch in measured:
            raise UserError(f"{source}, line {line}: group {row['group']!r} has "
                            f"batch size {batch} twice")
        measured[batch] = (step_ms / 1000, comm_ms / 1000)
    return {group: _measured(group, measured, exchange.get(group))
            for group, measured in groups.items()}


def exchange_cost(row: Mapping[str, object]) -> ExchangeCost | None:
    """A calibration row's exchange columns (numbers, or space-separated numbers, in ms), or
    None where the row has none (a one-worker mix)."""
    if any(row.get(c) in (None, "") for c in EXCHANGE_COLUMNS):
        return None
    waits, costs = ([float(v) / 1000 for v in str(row[c]).split()] for c in EXCHANGE_COLUMNS)
    if len(waits) != len(costs):
        raise ValueError("exchange columns of different lengths")
    return ExchangeCost.of(zip(waits, costs))


def _measured(group: str, measured: dict[int, tuple[float, float]],
              exchange: ExchangeCost | None) -> MeasuredProfile:
    sizes = sorted(measured)
    return MeasuredProfile(f"measured:{group}", tuple(sizes),
                           tuple(measured[b][0] - measured[b][1] for b in sizes),
                           statistics.median(comm for _, comm in measured.values()) / 2,
                           exchange)


def _check_batch(batch_size: int) -> None:
    if batch_size < 1:
        raise ValueError(f"a step takes at least one example, not {batch_size}")
