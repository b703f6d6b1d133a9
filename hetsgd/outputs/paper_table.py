"""Tables of a simulated Hogbatch reproduction beside what Ma & Rusu report.

``python -m hetsgd.outputs.paper_table FOLDER [--shares-only]`` reads every run under FOLDER
(written by ``scripts/reproduce_hogbatch_sim.sh``), prints markdown tables to stdout and writes
them to FOLDER/paper_table.md. First, what the runs were, read from them (a script's overrides
change it): each setting of dataset, model, lr and budget with its methods and seeds. Then, per
machine and method, mean ± std over seeds of the update shares, the simulated GPU's busy share
(``utilization.gpu_util_mean``) and the CPU workers' (workers.csv busy / time); and, as
report.md shows times (mean, Student-t interval, n: see :mod:`hetsgd.outputs.intervals`), the
virtual time after which each run stays at or below each of its absolute target losses
(``time_to_loss``: sustained, on the test loss) and the speedup over the GPU alone (per seed,
the GPU's time over the method's: every method of a seed starts from the same model; their
geometric mean and its interval). A seed that reached a target and left it (``unstable_losses``)
has no time to it, is not credited in a speedup, and is named in the notes. The paper's numbers
are those of ``docs/papers.md`` (read off its figures, w8a); "not reported" where it gives none.
``--shares-only``: the caption and the first table alone, for runs too short for their losses
to mean anything. A run that did not complete, is not one of the reproduction's (another mix or
method), or lacks a number the tables need is a line under them, and the exit status is 1; a
folder without one of the reproduction's completed runs is a one-line error.
"""

from __future__ import annotations

import argparse
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from hetsgd.config.checks import finite_or_none
from hetsgd.errors import UserError
from hetsgd.outputs.cells import cell, mean_cell
from hetsgd.outputs.index import config_at, find_runs, load_csv, read_config, read_summary
from hetsgd.outputs.intervals import CONFIDENCE, METHOD, geometric_interval
from hetsgd.outputs.metrics import loss_key, loss_name
from hetsgd.outputs.report import markdown_table
from hetsgd.outputs.safe_text import shown
from hetsgd.outputs.terminal import error_line, run_script

MACHINES = {"paper_hogbatch_v100": "V100 (AWS p3.16xlarge)",
            "paper_hogbatch_k80": "K80 (UC Merced)"}
# CPU Hogwild alone runs once, on the V100 mix: the K80 mix's CPU group is the same, so its rows
# are that run's
SAME_RUNS = {("paper_hogbatch_k80", "hogwild"): ("paper_hogbatch_v100", "hogwild")}
METHODS = {"hogwild": "CPU Hogwild", "sync": "GPU alone", "hogbatch": "Hogbatch (CPU+GPU)",
           "adaptive": "Adaptive"}
NOT_REPORTED = "not reported"
CURVES = ("train_loss", "test_loss")  # the losses a run is timed on


@dataclass(frozen=True)
class Paper:
    """What the paper reports for one method on one machine, on w8a (hogbatch.md §6)."""

    cpu_share: str = NOT_REPORTED  # §6c
    utilization: str = NOT_REPORTED  # §6d: covtype on the K80 server only
    curve: str = NOT_REPORTED  # §6a: normalized loss (its definition NOT FOUND) at a time


ALONE = "1 device"
PAPER = {
    ("paper_hogbatch_v100", "hogwild"): Paper(ALONE, curve="≈0.35 @20 s"),
    ("paper_hogbatch_v100", "sync"): Paper(ALONE, curve="≈0.93 @20 s"),
    ("paper_hogbatch_v100", "hogbatch"): Paper("≈0.98", curve="≈0.97 @~1 s"),
    ("paper_hogbatch_v100", "adaptive"): Paper("≈0.55", curve="≈0.77 @2 s, ≈0.91 @5 s, ≈0.99 @10 s"),
    ("paper_hogbatch_k80", "hogwild"): Paper(ALONE, "covtype: CPU ≈74–76 %", "≈0.37 @20 s"),
    ("paper_hogbatch_k80", "sync"): Paper(ALONE, curve="≈0.53 @20 s"),
    ("paper_hogbatch_k80", "hogbatch"): Paper("≈0.98", "covtype: GPU ≈82–97 %, CPU ≈80 %",
                                              "≈0.6 @3 s, ≈0.96 @~10 s"),
    ("paper_hogbatch_k80", "adaptive"): Paper("≈0.77", "covtype: GPU ≈45–53 %, CPU ≈70 %",
                                              "≈0.79 @2 s, ≈0.93 @4 s, ≈0.99 @8 s"),
}


@dataclass
class Run:
    """One completed run's numbers."""

    seed: int
    time_s: float
    cpu_share: float | None
    gpu_util: float | None  # percent
    cpu_busy: float | None  # percent, mean over the CPU group's workers
    final_loss: float | None
    times: dict[float, float | None]  # target loss -> virtual seconds, None: not reached
    snapshots: int  # evaluated snapshots, the first and the last included
    adaptive: dict | None  # summary.json's entry, for an Adaptive run
    final_batches: dict[str, int]  # group -> its first worker's batch size at the end
    unstable: list[float] = field(default_factory=list)  # targets reached, then left
    curve: str = "train_loss"  # the loss timed (summary target_losses.curve)
    setting: str = ""  # its dataset, model, lr and budget (:func:`setting`), escaped


@dataclass
class Row:
    machine: str
    algo: str
    runs: list[Run] = field(default_factory=list)
    same_as: str | None = None  # the machine whose runs these are

    def by_seed(self) -> dict[int, Run]:
        return {run.seed: run for run in self.runs}


def _field(summary: dict[str, Any], *path: str) -> Any:
    """The summary's value at ``path`` (keys, outermost first); a :class:`UserError` naming it
    where the summary lacks it."""
    value: Any = summary
    for key in path:
        if not isinstance(value, dict) or key not in value:
            raise UserError(f"its summary.json has no {'.'.join(path)}")
        value = value[key]
    return value


def _number(value: Any) -> str:
    return format(value, "g") if isinstance(value, int | float) else str(value)


def setting(summary: dict[str, Any], config: dict[str, Any]) -> str:
    """What a run was, from its summary and config.yaml: dataset, model, lr and budget, escaped
    (read back). The script's overrides may change any of them, so the tables' caption is this,
    not what the script meant to run."""
    model = config_at(config, "model")
    model = model if isinstance(model, dict) else {}
    name = model.get("name", summary.get("model"))
    shape = "".join(f" {model[key]}" for key in ("hidden", "activation") if key in model)
    paper = "" if name == "mlp_paper" else " (not the paper's net, mlp_paper)"
    unit = "virtual s" if summary.get("simulated") else "s"
    seconds, epochs = config_at(config, "budget", "seconds"), config_at(config, "budget", "epochs")
    budget = " or ".join(f"{_number(value)} {what}" for value, what in
                         ((seconds, unit), (epochs, "epochs")) if value is not None)
    lr = config_at(config, "optim", "lr")
    return shown(f"{summary.get('dataset')} · {name}{shape}{paper} · "
                 f"lr {'not in config.yaml' if lr is None else _number(lr)} · "
                 f"{budget or 'budget not in config.yaml'}")


def read_run(run_dir: Path, summary: dict[str, Any]) -> Run:
    """One completed run's numbers. A run folder is data, and may hold anything: where it lacks
    a number the tables need, a :class:`UserError` says which, and costs only this run."""
    workers = load_csv(run_dir, "workers")
    convergence = load_csv(run_dir, "convergence")
    if workers is None or convergence is None:  # a completed run writes both
        raise UserError("it lacks workers.csv or convergence.csv")
    lacking = sorted({"busy_s", "last_batch"} - set(workers.columns))
    if lacking:
        raise UserError(f"its workers.csv lacks {', '.join(lacking)}")
    seed = _field(summary, "seed")
    if not isinstance(seed, int):  # a seed pairs the GPU's run with the method's
        raise UserError("its seed is not a number")
    time_s = finite_or_none(_field(summary, "time_s"))
    if time_s is None or time_s <= 0:
        raise UserError("its time_s is not a positive number")
    targets = _field(summary, "target_losses")
    losses = _field(summary, "target_losses", "losses")
    if not isinstance(losses, list) or not all(isinstance(t, (int, float))
                                               and finite_or_none(t) is not None for t in losses):
        raise UserError("its target_losses.losses is not a list of numbers")
    curve = targets.get("curve") or "train_loss"
    if curve not in CURVES:
        raise UserError(f"its target_losses.curve is not one of {', '.join(CURVES)}")
    adaptive, shares = summary.get("adaptive"), _field(summary, "update_share")
    if adaptive is not None and not isinstance(adaptive, dict):
        raise UserError("its adaptive entry is not an object")
    if not isinstance(shares, dict):
        raise UserError("its update_share is not an object")
    times = {target: _field(summary, "time_to_loss", loss_key(target)) for target in losses}
    if any(t is not None and not (finite_or_none(t) is not None and t >= 0)
           for t in times.values()):
        raise UserError("its time_to_loss holds a time that is not a number of seconds")
    cpu = workers[workers["group"] == "cpu"]
    busy = pd.to_numeric(cpu["busy_s"], errors="coerce") / time_s
    last = workers.drop_duplicates("group").set_index("group")["last_batch"].map(finite_or_none)
    unstable = summary.get("unstable_losses")
    left = set(map(str, unstable)) if isinstance(unstable, list) else set()
    return Run(seed=seed, time_s=time_s,
               cpu_share=shares.get("cpu", 0.0),
               gpu_util=(summary.get("utilization") or {}).get("gpu_util_mean"),
               cpu_busy=100 * float(busy.mean()) if len(cpu) else None,
               final_loss=_field(summary, "final", "train_loss"), times=times,
               snapshots=len(convergence), adaptive=adaptive,
               final_batches={str(group): int(size) for group, size in last.items()
                              if size is not None},
               unstable=[t for t in times if loss_key(t) in left], curve=curve,
               setting=setting(summary, read_config(run_dir)))


def read_rows(folder: Path) -> tuple[list[Row], list[str]]:
    """The completed runs of the reproduction by (machine, method), in table order; and one line
    per other run (not completed, not one of the reproduction's, or unreadable), escaped."""
    rows: dict[tuple[str, str], Row] = {}
    skipped = []
    for run_dir in find_runs(folder):
        summary = read_summary(run_dir)
        key = (summary.get("devices"), summary.get("algo"))
        if summary.get("status") != "completed":
            why = f"{summary.get('status')}: {summary.get('error')}"
        elif key not in PAPER:
            why = (f"devices={key[0]} algo={key[1]} is not one of the reproduction's runs "
                   "(scripts/reproduce_hogbatch_sim.sh)")
        else:
            try:
                run = read_run(run_dir, summary)
            except UserError as err:
                why = str(err)
            else:
                rows.setdefault(key, Row(*key)).runs.append(run)
                continue
        skipped.append(error_line(f"{run_dir}: {why}"))
    for key, source in SAME_RUNS.items():
        if key not in rows and source in rows:
            rows[key] = Row(*key, runs=rows[source].runs, same_as=source[0])
    order = [(m, a) for m in MACHINES for a in METHODS]
    return sorted(rows.values(), key=lambda r: order.index((r.machine, r.algo))), skipped


def _present(values: Sequence[float | None]) -> list[float]:
    """The values that are finite numbers: None is a run without one, NaN an unknown one."""
    return [v for v in values if v is not None and math.isfinite(v)]


def mean_std(values: Sequence[float | None], spec: str, total: int) -> str:
    """``mean ± std`` of the values that exist (None: not reached, NaN: unknown), ``(k/n)`` when
    only k of the n runs have one."""
    present = _present(values)
    if not present:
        return "—"
    text = format(statistics.fmean(present), spec)
    if len(present) > 1:
        text += f" ± {statistics.stdev(present):{spec}}"
    return text + (f" ({len(present)}/{total})" if len(present) < total else "")


def blind(run: Run) -> bool:
    """Whether the run took no snapshot between its first and its last, so that it cannot say
    when it reached a loss it reached (one-worker simulated runs, see the reproduction's notes)."""
    return run.snapshots <= 2


def time_to(run: Run, target: float) -> float | None:
    """The virtual time to ``target``: None if never reached, NaN if reached at an unknown time
    or not timed to it (another seed's relative target)."""
    reached = run.times.get(target, math.nan)
    return math.nan if reached is not None and blind(run) else reached


def _ratio(value: float) -> str:
    return f"{value:.1f}x" if value < 10 else f"{value:.0f}x"


def speedup(row: Row, gpu: Row | None, target: float) -> str:
    """Per seed, the GPU alone's time to ``target`` over the row's (a seed that did not stay at
    ``target`` is not credited, nor one where either side got there at 0 s: a target at or
    above where the runs began has no ratio); their geometric mean, its interval and n. Where the GPU
    alone never stayed there, its run's length over the row's time is a lower bound, and the
    cell shows the smallest bound or ratio as '≥'."""
    if gpu is None:
        return "—"
    exact, bounds = [], []
    for seed, run in row.by_seed().items():
        mine, base = time_to(run, target), gpu.by_seed().get(seed)
        if base is None or mine is None or not _present([mine]) or mine == 0:
            continue
        theirs = time_to(base, target)
        if theirs is None:
            bounds.append(base.time_s / mine)
        elif not math.isnan(theirs) and theirs > 0:
            exact.append(theirs / mine)
    if not bounds:
        if not exact:
            return "—"
        return cell(statistics.geometric_mean(exact), geometric_interval(exact), len(exact),
                    ".1f", len(row.runs), "x")
    known = len(bounds) + len(exact)
    return f"≥ {_ratio(min(bounds + exact))} n={known}" + (
        f"/{len(row.runs)}" if known < len(row.runs) else "")


def shares_table(rows: list[Row]) -> str:
    lines = []
    for row in rows:
        paper, n = PAPER[(row.machine, row.algo)], len(row.runs)
        lines.append([MACHINES[row.machine], METHODS[row.algo], str(n),
                      mean_std([r.cpu_share for r in row.runs], ".3f", n), paper.cpu_share,
                      mean_std([r.gpu_util for r in row.runs], ".0f", n),
                      mean_std([r.cpu_busy for r in row.runs], ".0f", n), paper.utilization])
    return markdown_table(["machine", "method", "seeds", "CPU update share", "paper",
                           "GPU busy [%]", "CPU workers busy [%]", "paper (utilization)"], lines)


def convergence_table(rows: list[Row]) -> str:
    targets = sorted({t for row in rows for run in row.runs for t in run.times}, reverse=True)
    gpus = {row.machine: row for row in rows if row.algo == "sync"}
    lines = []
    for row in rows:
        n = len(row.runs)
        lines.append([MACHINES[row.machine], METHODS[row.algo],
                      *(mean_cell([time_to(r, t) for r in row.runs], ".3f") for t in targets),
                      *(speedup(row, gpus.get(row.machine), t) for t in targets),
                      mean_std([r.final_loss for r in row.runs], ".4f", n),
                      PAPER[(row.machine, row.algo)].curve])
    curves = sorted({run.curve for row in rows for run in row.runs})
    loss = "/".join(map(loss_name, curves))
    legend = (f"Times: mean [{CONFIDENCE:.0%} {METHOD} interval of the mean, cut at 0]; speedups: "
              "geometric mean of the seeds' ratios [the same interval, of their logarithms] "
              "over the n seeds that have one (n=k/m: k of the row's m; n=1: no interval); "
              "other numbers: mean ± std over the seeds.")
    table = markdown_table(["machine", "method", *(f"t@{t:g} {loss} [virtual s]" for t in targets),
                            *(f"speedup vs GPU @{t:g}" for t in targets), "final train loss",
                            "paper: normalized loss @ time"], lines)
    return f"{legend}\n\n{table}"


def _losses(targets: Sequence[float]) -> str:
    return " and ".join(f"{t:.4g}" for t in targets)


def _controller(adaptive: dict[str, Any], final_batches: dict[str, int]) -> str:
    """Where Adaptive's controller ended, as its summary entry says (escaped: it is read back); a
    run too short to close a window has no last share."""
    share = finite_or_none(adaptive.get("last_window_share"))
    last = "none (no window closed)" if share is None else f"{share:.3f}"
    return shown(f"last window's GPU share {last} (target {adaptive.get('target_share')}), "
                 f"bound: {adaptive.get('bound') or 'none'}; batch sizes at the end: "
                 + ", ".join(f"{group} {size}" for group, size in final_batches.items()))


def caption(rows: list[Row]) -> str:
    """What the runs were: per setting (:func:`setting`), its methods, seeds and runs."""
    methods: dict[str, dict[str, list[int]]] = {}
    for row in rows:
        for run in row.runs if row.same_as is None else []:
            methods.setdefault(run.setting, {}).setdefault(METHODS[row.algo], []).append(run.seed)
    lines = []
    for what, seeds_by_method in methods.items():
        seeds = sorted({seed for seeds in seeds_by_method.values() for seed in seeds})
        runs = sum(map(len, seeds_by_method.values()))
        lines.append(f"- {what}: {', '.join(seeds_by_method)}; seed{'s' * (len(seeds) > 1)} "
                     f"{', '.join(map(str, seeds))} ({runs} run{'s' * (runs > 1)})")
    return "\n".join(["The runs (their summary.json and config.yaml):", *lines])


def notes(rows: list[Row]) -> list[str]:
    """Rows that show another machine's runs; where Adaptive's controller stood at the end (its
    last window's share, the bound that stopped it, the batch sizes it settled on; seeds that
    ended alike share a line); the seeds that reached a target and left it; and the runs that
    cannot time their losses."""
    lines = []
    for row in rows:
        where = f"{METHODS[row.algo]}, {MACHINES[row.machine]}"
        if row.same_as is not None:
            lines.append(f"{where}: the runs on {MACHINES[row.same_as]}, whose CPU group is the "
                         "same")
            continue
        seeds_by_end: dict[str, list[int]] = {}
        for run in row.runs:
            if run.adaptive is not None:
                seeds_by_end.setdefault(_controller(run.adaptive, run.final_batches),
                                        []).append(run.seed)
            if run.unstable:
                lines.append(f"{where}, seed {run.seed}: reached {_losses(run.unstable)} and "
                             "left it (unstable): no time to it, not credited")
            if blind(run) and any(t is not None for t in run.times.values()):
                lines.append(f"{where}, seed {run.seed}: no snapshot between the first and the "
                             "last, so the times to the losses it reached are unknown")
        lines += [f"{where}, seed{'s' * (len(seeds) > 1)} {', '.join(map(str, seeds))}: {end}"
                  for end, seeds in seeds_by_end.items()]
    return lines


def write_tables(folder: Path, shares_only: bool = False) -> tuple[str, list[str]]:
    """The tables of the runs under ``folder`` as markdown, also written to its paper_table.md,
    and one line per run left out of them. No completed run of the reproduction is a
    :class:`UserError`."""
    rows, skipped = read_rows(folder)
    if not rows:
        left_out = f": {len(skipped)} run(s) left out, the first {skipped[0]}" if skipped else ""
        raise UserError(f"no completed run of the reproduction under {folder}{left_out}")
    parts = [caption(rows), shares_table(rows)]
    if not shares_only:
        parts.append(convergence_table(rows))
    parts += ["\n".join(f"- {line}" for line in notes(rows) + skipped)]
    text = "\n\n".join(p for p in parts if p) + "\n"
    (folder / "paper_table.md").write_text(text)
    return text, skipped


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path)
    parser.add_argument("--shares-only", action="store_true",
                        help="only the update shares and utilizations")
    args = parser.parse_args()
    text, skipped = write_tables(args.folder, args.shares_only)
    print(text)
    return 1 if skipped else 0


if __name__ == "__main__":
    run_script("paper_table", main)
