"""Real against simulated on this machine: the check that the virtual clock models it.

Each case is one config run twice per seed: by the real engine, and on the virtual clock with
the profiles that a calibration of its mix measured just before (``hetsgd devices
--calibrate``). Compared: examples per second, the host group's share of the updates, and the
time to a fixed training loss, each the median over the seeds, simulated over real. A wrong
model of the machine (a step's time, a replica's copies, the slowdown, how the ranks wait for
each other) shows as a ratio far from 1; a noisy machine moves it by some percent.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hetsgd.config import compose_run, to_run_config
from hetsgd.outputs.metrics import loss_key
from hetsgd.runs import runner
from hetsgd.runs.calibrate import calibrate, save

# the metrics compared, as (name, reader of a summary.json)
METRICS: dict[str, Callable[[dict[str, Any]], float | None]] = {
    "examples/s": lambda summary: summary.get("examples_per_s"),
    "host update share": lambda summary: (summary.get("update_share") or {}).get("cpu"),
}
TIME_TO_LOSS = "time to loss"


@dataclass(frozen=True)
class Case:
    """A config compared real against simulated; ``mix`` are the overrides that make its device
    mix, which the calibration measures."""

    name: str
    mix: tuple[str, ...]
    algo: tuple[str, ...]


CASES = (
    Case("hogwild, 2 workers", ("devices=cpu", "devices.groups.cpu.count=2"), ("algo=hogwild",)),
    Case("hogbatch, CPU 4x slower", ("devices=emulated", "devices.groups.cpu.slowdown=4"),
         ("algo=hogbatch",)),
    Case("adaptive, CPU 4x slower", ("devices=emulated", "devices.groups.cpu.slowdown=4"),
         ("algo=adaptive",)),
    Case("local SGD, balanced", ("devices=emulated",), ("algo=local_sgd", "algo.tau=8")),
    Case("local SGD, unbalanced", ("devices=emulated",), ("algo=local_sgd", "algo.tau=auto")),
)


@dataclass(frozen=True)
class Comparison:
    case: str
    metric: str
    real: float | None  # median over the seeds
    simulated: float | None

    @property
    def ratio(self) -> float | None:
        if self.real is None or self.simulated is None or self.real == 0:
            return None
        return self.simulated / self.real


def _median(values: Sequence[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if len(known) == len(values) and known else None


def _run(overrides: Sequence[str], run_dir: Path) -> dict[str, Any]:
    cfg = compose_run(list(overrides))
    summary = runner.run(to_run_config(cfg), run_dir, cfg)
    if summary["status"] != "completed":
        raise RuntimeError(f"{' '.join(overrides)}: {summary['status']}: {summary['error']}")
    return summary


def validate(cases: Sequence[Case], common: Sequence[str], seeds: Sequence[int],
             target_loss: float, out: Path, calibration_s: float = 0.5,
             progress: Callable[[str], None] = lambda line: None) -> list[Comparison]:
    """Calibrate each distinct mix (``calibration_s`` a batch size), run every case real and
    simulated under ``common`` overrides (data, model, budget) for each seed into ``out``, and
    compare."""
    calibrations: dict[tuple[str, ...], Path] = {}
    for mix in dict.fromkeys(case.mix for case in cases):
        progress(f"calibrating {' '.join(mix)}")
        cfg = to_run_config(compose_run([*common, *mix, f"results_dir={out}"]))
        calibrations[mix] = save(calibrate(cfg, calibration_s), cfg)
    common = (*common, f"eval.target_losses=[{target_loss}]", f"results_dir={out}")
    comparisons = []
    for case in cases:
        folder = out / "".join(c if c.isalnum() else "_" for c in case.name)
        summaries: dict[str, list[dict[str, Any]]] = {"real": [], "simulated": []}
        for seed in seeds:
            overrides = (*common, *case.mix, *case.algo, f"seed={seed}")
            progress(f"{case.name}, seed {seed}: real")
            summaries["real"].append(_run(overrides, folder / f"seed{seed}_real"))
            progress(f"{case.name}, seed {seed}: simulated")
            summaries["simulated"].append(_run(
                (*overrides, "devices.simulated=true", f"devices.calibration={calibrations[case.mix]}"),
                folder / f"seed{seed}_simulated"))
        readers = {**METRICS, TIME_TO_LOSS: lambda summary: (summary.get("time_to_loss") or {})
                   .get(loss_key(target_loss))}
        for metric, read in readers.items():
            comparisons.append(Comparison(case.name, metric,
                                          _median([read(s) for s in summaries["real"]]),
                                          _median([read(s) for s in summaries["simulated"]])))
    return comparisons


def table(comparisons: Sequence[Comparison]) -> str:
    """The comparisons as a markdown table."""
    def cell(value: float | None) -> str:
        return "—" if value is None else f"{value:.4g}"

    lines = ["| case | metric | real | simulated | simulated / real |", "|---|---|---|---|---|"]
    lines += [f"| {c.case} | {c.metric} | {cell(c.real)} | {cell(c.simulated)} | "
              f"{'—' if c.ratio is None else f'{c.ratio:.2f}'} |" for c in comparisons]
    return "\n".join(lines)
