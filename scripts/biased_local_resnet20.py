"""Lim et al.'s comparison with their network, ResNet20, on their machine simulated
(``+experiment=biased_local_resnet20``, Fashion-MNIST), and its table: virtual
time to a common test accuracy, test accuracy at the common epoch budget, mean ± std over seeds,
and the simulated step of each group (docs/results/biased_local_resnet20.md).

    python scripts/biased_local_resnet20.py run [OVERRIDES...]   # the sweep, report, tables
    python scripts/biased_local_resnet20.py table FOLDER          # the tables of a finished run
    python scripts/biased_local_resnet20.py steps                 # the simulated steps alone

A ResNet20 forward pass costs about a third of a step here, and every snapshot evaluates the
whole test set: ``run`` evaluates a seeded stratified subset of Fashion-MNIST's published test
set instead (``--test-size``), written once as IDX files beside the published training files.
"""

from __future__ import annotations

import argparse
import gzip
import struct
import subprocess
import sys
from datetime import datetime
from pathlib import Path

import numpy as np
import pandas as pd

from hetsgd.config import RunConfig, compose_run, to_run_config
from hetsgd.config.checks import finite_or_none
from hetsgd.config.compose import quoted
from hetsgd.config.paths import results_folder
from hetsgd.data.images import DEBIAN_FASHION_DIR, read_idx
from hetsgd.data.prepare import split_rows
from hetsgd.data.registry import get_source
from hetsgd.engines.virtual.mix import profiles_for
from hetsgd.engines.virtual.profiles import DeviceProfile, RooflineProfile
from hetsgd.errors import UserError
from hetsgd.model.problem import Problem
from hetsgd.outputs import cells, intervals
from hetsgd.outputs.index import (
    config_number,
    find_runs,
    load_csv,
    override_values,
    read_overrides,
    read_summary,
    tau_text,
)
from hetsgd.outputs.metrics import sustained
from hetsgd.outputs.report import markdown_table
from hetsgd.outputs.safe_text import shown
from hetsgd.outputs.terminal import run_script
from hetsgd.workers import expand

ORDER = ("sync", "fast_alone", "local_balanced", "local_unbalanced", "local_biased")
PAPER = {"sync": "baseline",  # Lim et al., abstract and TL;DR: docs/papers.md
         "local_biased": "up to 32x faster than sync, nearly identical accuracy"}
HEADERS = ("method", "runs", "tau", "t@acc [virtual ms]", "speedup vs sync", "ep@acc",
           "test acc @ budget", "examples/virtual s", "throughput vs sync",
           "throughput x epochs vs sync", "paper")


def write_idx(path: Path, array: np.ndarray) -> None:
    """``array`` (uint8) as a gzipped IDX file, the format :func:`read_idx` reads."""
    header = b"\0\0\x08" + bytes([array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape)
    with gzip.open(path, "wb") as f:
        f.write(header + array.astype(np.uint8).tobytes())


def fashion_files() -> list[str]:
    """The published names of Fashion-MNIST's four files: train images and labels, test."""
    return [remote.name for remote in get_source("fashion_mnist").remotes]


def with_test_subset(source: Path, target: Path, size: int, seed: int = 0) -> Path:
    """A folder ``dataset.path`` can name: Fashion-MNIST's training files linked from
    ``source``, and a seeded stratified ``size`` of its test set."""
    target.mkdir(parents=True, exist_ok=True)
    images_train, labels_train, images_test, labels_test = fashion_files()
    for name in (images_train, labels_train):
        if not (target / name).exists():
            (target / name).symlink_to(source / name)
    labels = read_idx(source / labels_test)
    kept, _, _ = split_rows(labels, "multiclass", seed, train_size=size)
    write_idx(target / images_test, read_idx(source / images_test)[kept])
    write_idx(target / labels_test, labels[kept])
    return target


# the problems the simulated steps are priced for: ResNet20 on Fashion-MNIST (what runs here)
# and on CIFAR-10 (the paper's), and the MLP of the w8a simulation (docs/results/biased_local_sim.md)
PROBLEMS = {
    "resnet20 on fashion_mnist": (("+experiment=biased_local_resnet20",),
                                  Problem("multiclass", 784, 10, (1, 28, 28))),
    "resnet20 on cifar10": (("+experiment=biased_local_resnet20", "dataset=cifar10"),
                            Problem("multiclass", 3072, 10, (3, 32, 32))),
    "mlp [1024, 1024] on w8a": (("+experiment=biased_local_paper_sim",),
                                Problem("binary", 300, 1, None)),
}


def group_profiles(cfg: RunConfig, problem: Problem) -> dict[str, tuple[int, DeviceProfile]]:
    """Each group's batch size and device profile, as the virtual engine builds them."""
    specs = expand(cfg.devices)
    profiles = profiles_for(cfg, specs, problem, cfg.optim.step)
    return {s.group: (s.batch_size, p) for s, p in zip(specs, profiles, strict=True)}


def steps() -> str:
    """The paper mix's step per group and the ratio, for each of ``PROBLEMS``; a roofline step
    is its operators' launches plus the slower of its FLOPs and its bytes, each shown."""
    rows = []
    for name, (overrides, problem) in PROBLEMS.items():
        cfg = to_run_config(compose_run(["+method=local_unbalanced", *overrides,
                                         "devices=paper_biased_local"]))
        step, parts = {}, {}
        for group, (batch, profile) in group_profiles(cfg, problem).items():
            step[group] = profile.compute_s(batch)
            parts[group] = (" (" + " / ".join(f"{t * 1e3:.2f}" for t in roofline_parts(
                profile, batch)) + ")") if isinstance(profile, RooflineProfile) else ""
        rows.append([name, str(cfg.devices.groups["accel"].batch_size)] + [
            f"{step[g] * 1e3:.3f}{parts[g]}" for g in ("accel", "cpu")]
            + [f"{step['cpu'] / step['accel']:.2f}"])
    return markdown_table(("model", "batch", "V100 step (launches / FLOPs / bytes) [ms]",
                           "CPU socket step (launches / FLOPs / bytes) [ms]", "socket / V100"),
                          rows)


def roofline_parts(profile: RooflineProfile, batch: int) -> tuple[float, float, float]:
    """Seconds of a step's operator launches, of its FLOPs and of its memory traffic."""
    device, cost = profile.device, profile.cost
    return (cost.kernels_per_step * device.launch_s,
            (batch * cost.flops_per_example + cost.update_flops)
            / (device.peak_flops * device.efficiency),
            (batch * cost.bytes_per_example + cost.bytes_per_step) / device.memory_bandwidth)


def run(overrides: list[str], test_size: int) -> tuple[Path, int]:
    """The sweep, evaluated on a test subset, then ``hetsgd report``; the folder, and the first
    non-zero exit status of the two (a job that failed or diverged: the sweep's 1)."""
    out = results_folder() / "biased_local_resnet20" / datetime.now().strftime("%Y-%m-%d_%H-%M-%S")
    data = with_test_subset(DEBIAN_FASHION_DIR, out / f"fashion_mnist_test{test_size}", test_size)
    hetsgd = [sys.executable, "-m", "hetsgd"]
    swept = subprocess.run([*hetsgd, "run", "-m", "+experiment=biased_local_resnet20",
                            f"results_dir={quoted(out)}", f"dataset.path={quoted(data)}",
                            "progress=false", *overrides], check=False)
    # the fast_alone runs are sync runs too: the baseline is the one on both groups
    reported = subprocess.run([*hetsgd, "report", str(out), "--baseline",
                               "algo=sync mix.cpu.count=2"], check=False,
                              stdout=subprocess.DEVNULL)
    return out, swept.returncode or reported.returncode


def runs(out: Path) -> pd.DataFrame:
    """One row per completed run of the experiment under ``out``: method, seed, its convergence
    curve, summary and epoch budget. Run folders are data: a readable folder of another
    experiment is passed over; a completed run of this one that lacks what the table needs, an
    unreadable overrides file, or no sync run at all is a :class:`UserError` naming it."""
    rows = []
    for run_dir in find_runs(out):
        swept = override_values(read_overrides(run_dir))
        summary = read_summary(run_dir)
        if swept.get("method") not in ORDER or summary.get("status") != "completed":
            continue
        curve, budget = load_csv(run_dir, "convergence"), config_number(run_dir, "budget", "epochs")
        lacking = [what for what, missing in (
            ("a seed override", not str(swept.get("seed", "")).isdecimal()),
            ("convergence.csv's test_acc in numbers", curve is None or "test_acc" not in curve
             or not pd.api.types.is_numeric_dtype(curve["test_acc"])),
            ("config.yaml's budget.epochs", budget is None)) if missing]
        if lacking:
            raise UserError(f"{run_dir} lacks {', '.join(lacking)}")
        rows.append({"method": swept["method"], "seed": int(swept["seed"]), "summary": summary,
                     "curve": curve, "budget": budget})
    if not any(row["method"] == "sync" for row in rows):
        raise UserError(f"no completed sync run of +experiment=biased_local_resnet20 under "
                        f"{out}: the table's speedups are over it")
    return pd.DataFrame(rows)


def held(curve: pd.DataFrame, accuracy: float, column: str) -> float:
    """``column`` (``time_s``, ``epoch``) from which the test accuracy stays at or above
    ``accuracy`` to the run's end, as ``hetsgd report`` times a target; NaN for a run that ends
    below it, however early it touched it."""
    reach = sustained(curve[column], curve["test_acc"], accuracy)
    return float("nan") if reach.time is None else reach.time


def at_epoch(curve: pd.DataFrame, epoch: float) -> float:
    """The test accuracy at ``epoch``, interpolated between snapshots (a round of local SGD can
    end past the budget); NaN if the run stopped before it."""
    if curve["epoch"].iloc[-1] < epoch:
        return float("nan")
    return float(np.interp(epoch, curve["epoch"], curve["test_acc"]))


def common_accuracy(frame: pd.DataFrame) -> float:
    """The highest test accuracy, to the hundredth below, that every run holds at its end."""
    return float(np.floor(min(c["test_acc"].iloc[-1] for c in frame["curve"]) * 100) / 100)


def spread(values: pd.Series, fmt: str) -> str:
    values = values.dropna()
    if values.empty:
        return "—"
    std = f" ± {values.std():{fmt}}" if len(values) > 1 else ""
    return f"{values.mean():{fmt}}{std}"


def speedup(base: pd.Series, times: pd.Series) -> str:
    """The ratio of the mean times and its Student-t interval (each side sampled on its own);
    none where a run of either side never held the accuracy (the mean of the others would
    flatter that side, as `hetsgd report` says too)."""
    if base.isna().any() or times.isna().any() or base.empty or times.empty:
        return "—"
    base, times = base.tolist(), times.tolist()
    spread = intervals.ratio_interval(base, times)
    ratio = f"{np.mean(base) / np.mean(times):.2f}"
    return f"{ratio} {cells.bracket(*spread, '.2f')}" if spread else ratio


def table(out: Path, accuracy: float | None = None) -> str:
    """The markdown table of the runs under ``out``, after a line naming the target accuracy and
    the epoch budget. Times are as the snapshots are stamped (as in ``hetsgd report``);
    "throughput x epochs" is the speedup again from examples per virtual second and epochs to
    the accuracy, the two parts it comes from."""
    frame = runs(out)
    target = common_accuracy(frame) if accuracy is None else accuracy
    budget = float(frame["budget"].iloc[0])
    frame["t"] = [held(c, target, "time_s") * 1e3 for c in frame["curve"]]
    frame["ep"] = [held(c, target, "epoch") for c in frame["curve"]]
    frame["acc"] = [at_epoch(c, budget) for c in frame["curve"]]
    frame["rate"] = [finite_or_none(s.get("examples_per_s")) for s in frame["summary"]]
    sync = frame[frame["method"] == "sync"]
    sync_ep, sync_rate = sync["ep"].mean(), sync["rate"].mean()
    rows = []
    for method in [m for m in ORDER if m in set(frame["method"])]:
        group = frame[frame["method"] == method]
        reached = group["t"].notna().sum()
        rows.append([method, f"{reached}/{len(group)}", tau_text(group["summary"].iloc[0]),
                     cells.mean_cell(group["t"].tolist(), ".1f"), speedup(sync["t"], group["t"]),
                     cells.mean_cell(group["ep"].tolist(), ".2f"),
                     spread(group["acc"], ".3f"), spread(group["rate"], ".0f"),
                     f"{group['rate'].mean() / sync_rate:.2f}",
                     f"{group['rate'].mean() / sync_rate * sync_ep / group['ep'].mean():.2f}",
                     PAPER.get(method, "not reported")])
    head = (f"common test accuracy {target:.2f} (t@acc, ep@acc: from when a run holds it to its "
            f"end), common budget {budget:g} epochs (test acc @ budget); times and epochs: "
            "mean [95% Student-t interval] n=k/m over the runs that held it; speedups: of the "
            "mean times [interval], where every run of both held it; other numbers mean ± std "
            "over the completed runs (seeds)")
    return head + "\n\n" + markdown_table(HEADERS, rows)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    run_cmd = sub.add_parser("run", help="both sweeps, the report, then the table")
    run_cmd.add_argument("--test-size", type=int, default=1000)
    run_cmd.add_argument("overrides", nargs="*")
    sub.add_parser("steps", help="the paper mix's simulated step per group, by model")
    table_cmd = sub.add_parser("table", help="the table of a finished run folder")
    table_cmd.add_argument("folder", type=Path)
    table_cmd.add_argument("--accuracy", type=float, default=None,
                           help="the common test accuracy (default: the best every run reaches)")
    args = parser.parse_args()
    if args.command == "steps":
        print(steps())
        return 0
    folder, status = (run(args.overrides, args.test_size) if args.command == "run"
                      else (args.folder, 0))
    print(steps() + "\n\n" + shown(table(folder, getattr(args, "accuracy", None)), lines=True))
    print(f"\nreport: {folder}/report.md")
    if status:  # the table holds the completed runs alone: say that some are not among them
        print(f"biased_local_resnet20: the sweep or its report exited {status}: "
              f"`hetsgd runs {shown(str(folder))}` lists each run's status", file=sys.stderr)
    return status


if __name__ == "__main__":
    run_script("biased_local_resnet20", main)
