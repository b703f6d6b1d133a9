"""Real against simulated on this machine: the check that the virtual clock models it.

Each case is one config run twice per seed: by the real engine, and on the virtual clock with
the profiles that a calibration of its mix measured just before the real run (``hetsgd machine
--calibrate``). Compared: examples per second, the host group's share of the updates, the
workers' CPU share with how many of each side's runs were flagged as contended (where the runs
record it: a busy machine slows the real run alone; a simulated run's share is the
simulator's, never flagged) and the time to a fixed training loss (held to the run's end),
simulated over real, the median of the seeds' ratios. A wrong model of the machine (a step's
time, a replica's copies, the slowdown, how the ranks wait for each other) shows as a ratio
far from 1; a noisy machine moves it by some percent.

A machine whose speed moved during a real run (another process, a VM's neighbours) makes that
run no measure of the clock: each real run is therefore bracketed by calibrations, and a seed
whose two calibrations disagree by more than ``drift`` on any group's step is measured again
(this project's own guard: a comparison is only as good as the machine's steadiness).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import pandas as pd

from hetsgd.config import compose_run, to_run_config
from hetsgd.outputs.metrics import loss_key, time_to_losses
from hetsgd.outputs.summary import RunSummary
from hetsgd.runs import runner
from hetsgd.runs.calibrate import calibrate, save


def _contention(summary: RunSummary) -> dict:
    """The run's ``contention`` entry in summary.json; empty where it does not record one."""
    entry = summary.to_dict().get("contention")
    return entry if isinstance(entry, dict) else {}


def _workers_cpu_share(summary: RunSummary) -> float | None:
    """The CPU time the run's workers got over what they wanted (None where the run does not
    record it): a busy machine explains a slow real run."""
    share = _contention(summary).get("workers_cpu_share")
    return float(share) if isinstance(share, int | float) else None


def flagged(summary: RunSummary) -> bool:
    """Whether the run's workers got too little of the CPU they wanted (``contention.flagged``)."""
    return _contention(summary).get("flagged") is True


CPU_SHARE = "workers' CPU share"
# the metrics compared, as (name, reader of a completed run's summary)
METRICS: dict[str, Callable[[RunSummary], float | None]] = {
    "examples/s": lambda summary: summary.examples_per_s,
    "host update share": lambda summary: (summary.update_share or {}).get("cpu"),
    CPU_SHARE: _workers_cpu_share,
}
TIME_TO_LOSS = "time to training loss"


class UnsteadyMachine(RuntimeError):
    """The machine's speed moved during every attempt at a seed's real run: nothing to compare."""


@dataclass(frozen=True)
class Case:
    """A config compared real against simulated; ``mix`` are the overrides that make its device
    mix, which the calibration measures; ``target_loss``, where given, replaces the common one
    (for a method that does not get there in the runs' time)."""

    name: str
    mix: tuple[str, ...]
    algo: tuple[str, ...]
    target_loss: float | None = None

    def target(self, common: float) -> float:
        return common if self.target_loss is None else self.target_loss


CASES = (
    Case("hogwild, 2 workers", ("devices=cpu", "devices.groups.cpu.count=2"), ("algo=hogwild",)),
    Case("hogbatch, CPU 4x slower", ("devices=emulated", "devices.groups.cpu.slowdown=4"),
         ("algo=hogbatch",)),
    Case("adaptive, CPU 4x slower", ("devices=emulated", "devices.groups.cpu.slowdown=4"),
         ("algo=adaptive",)),
    # local SGD averages every round: at the common lr it is slower to a loss, hence 0.05
    Case("local SGD, balanced", ("devices=emulated",), ("algo=local_sgd", "algo.tau=8"), 0.05),
    # a fixed tau: tau=auto would compare two speed measurements, not the clock
    Case("local SGD, unbalanced", ("devices=emulated",),
         ("algo=local_sgd", "algo.tau={accel:1,cpu:4}"), 0.05),
)


@dataclass(frozen=True)
class Comparison:
    """One metric of one case over the seeds: each side's median, and the median of the
    seeds' simulated / real ratios (each seed's simulation replays the calibration made just
    before its own real run, so a seed is the pair to compare)."""

    case: str
    metric: str
    real: float | None
    simulated: float | None
    ratio: float | None
    # for the CPU share: how many real and simulated runs were flagged as contended, of how many
    flagged: tuple[int, int, int] | None = None

    @classmethod
    def of(cls, case: str, metric: str, real: Sequence[float | None],
           simulated: Sequence[float | None],
           flags: tuple[Sequence[bool], Sequence[bool]] | None = None) -> Comparison:
        ratios = [None if r is None or s is None or r == 0 else s / r
                  for r, s in zip(real, simulated)]
        counts = None if flags is None else (sum(flags[0]), sum(flags[1]), len(real))
        return cls(case, metric, _median(real), _median(simulated), _median(ratios), counts)


def _median(values: Sequence[float | None]) -> float | None:
    """The median, where every value is known."""
    known = [v for v in values if v is not None]
    return statistics.median(known) if len(known) == len(values) and known else None


def _time_to_training_loss(target: float) -> Callable[[RunSummary], float | None]:
    """The reader of a run's time after which its training loss stayed at or below ``target``
    (None where it ended above it, or the run left no convergence.csv). The training loss, not
    the test loss a report times: the clock's question is how fast training progresses, and an
    overfitting net's test loss (digits' ``mlp``: lowest within half a second, rising after)
    holds no low target to the end."""
    def read(summary: RunSummary) -> float | None:
        file = Path(summary.run_dir or "") / "convergence.csv"
        if summary.run_dir is None or not file.is_file():
            return None
        curve = pd.read_csv(file)
        return time_to_losses(curve["time_s"], curve["train_loss"], [target])[loss_key(target)]
    return read


def drift_between(before: Sequence[dict], after: Sequence[dict]) -> float:
    """The largest factor by which a group's step time moved from one calibration to the next,
    either way (1 where they agree): per group the geometric mean of its batch sizes' ratios.
    A load slows every batch size alike; one batch size's 0.25 s alone is noisier than that
    (back to back on a quiet machine, single rows have differed by 1.36x, the means by 1.08x)."""
    logs: dict[str, list[float]] = {}
    old = {(row["group"], row["batch_size"]): row["ms_per_step"] for row in before}
    for row in after:
        if (key := (row["group"], row["batch_size"])) in old:
            logs.setdefault(row["group"], []).append(math.log(row["ms_per_step"] / old[key]))
    return max(math.exp(abs(statistics.fmean(moves))) for moves in logs.values())


def _run(overrides: Sequence[str], run_dir: Path) -> RunSummary:
    cfg = compose_run(list(overrides))
    summary = runner.run(to_run_config(cfg), run_dir, cfg)
    if summary.status != "completed":
        raise RuntimeError(f"{' '.join(overrides)}: {summary.status}: {summary.error}")
    return replace(summary, run_dir=str(run_dir))  # as its summary.json names it


def validate(cases: Sequence[Case], common: Sequence[str], seeds: Sequence[int],
             target_loss: float, out: Path, calibration_s: float = 0.5,
             progress: Callable[[str], None] = lambda line: None, drift: float = 1.3,
             attempts: int = 3) -> list[Comparison]:
    """For every case and seed under ``common`` overrides (data, model, budget), with the time
    to ``target_loss`` (or the case's own) compared: calibrate the case's mix
    (``calibration_s`` a batch size), run it for real, then simulated with that calibration;
    compare seed by seed. Each real run follows its own calibration, so a machine whose speed
    drifts over minutes drifts in both; a real run whose calibrations before and after
    disagree by more than ``drift`` is run again, up to ``attempts`` times, then
    :class:`UnsteadyMachine`."""
    common = (*common, f"results_dir={out}")
    comparisons = []
    for case in cases:
        folder = out / "".join(c if c.isalnum() else "_" for c in case.name)
        target = case.target(target_loss)
        summaries: dict[str, list[RunSummary]] = {"real": [], "simulated": []}
        for seed in seeds:
            overrides = (*common, *case.mix, *case.algo, f"seed={seed}")
            cfg = to_run_config(compose_run(list(overrides)))
            for attempt in range(1, attempts + 1):
                progress(f"{case.name}, seed {seed}: calibrating, real run, calibrating")
                rows = calibrate(cfg, calibration_s)
                real = _run(overrides, folder / f"seed{seed}_real{attempt}")
                moved = drift_between(rows, calibrate(cfg, calibration_s))
                if moved <= drift:
                    break
                progress(f"{case.name}, seed {seed}: the machine's speed moved {moved:.2f}x "
                         "during the real run")
            else:
                raise UnsteadyMachine(f"{case.name}, seed {seed}: the machine's speed moved by "
                                      f"more than {drift:g}x during each of {attempts} real runs")
            calibration = save(rows, cfg)
            summaries["real"].append(real)
            progress(f"{case.name}, seed {seed}: simulated")
            summaries["simulated"].append(_run(
                (*overrides, "devices.simulated=true", f"devices.calibration={calibration}"),
                folder / f"seed{seed}_simulated"))
        readers = {**METRICS, f"{TIME_TO_LOSS} {target:g}": _time_to_training_loss(target)}
        flags = ([flagged(s) for s in summaries["real"]],
                 [flagged(s) for s in summaries["simulated"]])
        for metric, read in readers.items():
            comparisons.append(Comparison.of(case.name, metric,
                                             [read(s) for s in summaries["real"]],
                                             [read(s) for s in summaries["simulated"]],
                                             flags if metric == CPU_SHARE else None))
    return comparisons


def table(comparisons: Sequence[Comparison]) -> str:
    """The comparisons as a markdown table; the CPU share's cells say how many runs were
    flagged as contended, and a line under the table what a flagged real run means."""
    def cell(value: float | None, flags: int | None = None, runs: int = 0) -> str:
        text = "—" if value is None else f"{value:.4g}"
        return text if flags is None else f"{text}, {flags}/{runs} flagged"

    lines = ["| case | metric | real | simulated | simulated / real, by seed |",
             "|---|---|---|---|---|"]
    for c in comparisons:
        real_flags, simulated_flags, runs = c.flagged or (None, None, 0)
        lines.append(f"| {c.case} | {c.metric} | {cell(c.real, real_flags, runs)} | "
                     f"{cell(c.simulated, simulated_flags, runs)} | "
                     f"{'—' if c.ratio is None else f'{c.ratio:.2f}'} |")
    if any(c.flagged and c.flagged[0] for c in comparisons):
        lines += ["", "A flagged real run's workers got less of the CPU they wanted than "
                  "monitor.contention_threshold: its seed's ratios measure the contention, "
                  "not the virtual clock."]
    return "\n".join(lines)
