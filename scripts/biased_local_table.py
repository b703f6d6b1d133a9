"""The numbers of a simulated biased local SGD reproduction per method, beside what Lim et al.
report (for ResNet20 / CIFAR-10): ``python scripts/biased_local_table.py FOLDER`` prints them for
the runs under FOLDER (written by ``scripts/reproduce_biased_local_sim.sh``), after ``hetsgd report
FOLDER --baseline "algo=sync mix.cpu.count=2"`` has written its report.csv. The speedups are
report.csv's, over its baseline: a report whose baseline is not the sync method (the default may
pick fast_alone, a sync run too) is refused."""

from __future__ import annotations

import argparse
import re
from pathlib import Path
from typing import Any

import pandas as pd

from hetsgd.config.checks import finite_or_none
from hetsgd.errors import UserError, one_line
from hetsgd.outputs import cells
from hetsgd.outputs.index import (
    find_runs,
    json_object,
    override_values,
    read_config,
    read_overrides,
    read_summary,
    tau_text,
)
from hetsgd.outputs.report import markdown_table
from hetsgd.outputs.safe_text import shown
from hetsgd.outputs.summary import Mix
from hetsgd.outputs.terminal import run_script

ORDER = ("sync", "fast_alone", "local_balanced", "local_unbalanced", "local_biased")
PAPER = {  # Lim et al., abstract and TL;DR: docs/papers.md
    "sync": "baseline",
    "local_biased": "up to 32x faster than sync, nearly identical accuracy",
}
HEADERS = ("method", "runs", "tau", "t@0.9 [virtual s]", "t@0.95 [virtual s]",
           "speedup vs sync", "train loss", "test loss", "test acc", "update share gpu",
           "GPU util [%]", "CPU sockets busy [%]", "paper")
#: What scripts/reproduce_biased_local_sim.sh passes to ``hetsgd report``: sync on both groups.
SYNC_BASELINE = "algo=sync mix.cpu.count=2"


def method_runs(out: Path) -> tuple[dict[str, dict[str, Any]], dict[str, Any]]:
    """One completed run's summary per method of the reproduction under ``out`` (its tau, step
    times and mix), and the runs' model as their config.yaml says (read as data)."""
    runs, model = {}, {}
    for run_dir in find_runs(out):
        swept = override_values(read_overrides(run_dir))
        summary = read_summary(run_dir)
        if swept.get("method") in ORDER and summary.get("status") == "completed":
            runs[swept["method"]] = summary
            config_model = read_config(run_dir).get("model")
            model = config_model if isinstance(config_model, dict) else model
    return runs, model


def method_of(variant: object) -> str | None:
    """The reproduction's method a report row's variant names (``+method=local_biased``)."""
    found = re.search(r"\+method=(\S+)", str(variant))
    return found.group(1) if found and found.group(1) in ORDER else None


def timed(row: pd.Series, col: str) -> str:
    """A time as report.md shows it: mean [Student-t interval] n=k/m of the timed runs."""
    mean = row[f"{col}_mean"]
    if pd.isna(mean):
        return "—"
    return cells.cell(mean, (row[f"{col}_low"], row[f"{col}_high"]), int(row[f"{col}_n"]),
                      ".3f", int(row["timed"]))


def speedup(row: pd.Series) -> str:
    """The speedup over sync as report.md has it: ``≥`` a lower bound, its interval;
    ``baseline`` on sync's own row."""
    if row["baseline"]:
        return "baseline"
    if pd.isna(row["speedup"]):
        return "—"
    spread = cells.bracket(row["speedup_low"], row["speedup_high"], ".2f")
    bound = "≥" if row["speedup_bound"] == 1 else ""
    return " ".join(part for part in (bound, f"{row['speedup']:.2f}", spread) if part)


def cell(row: pd.Series, col: str, fmt: str) -> str:
    mean, std = row[f"{col}_mean"], row[f"{col}_std"]
    if pd.isna(mean):
        return "—"
    count = f" ({row[f'{col}_n']:.0f}/{row['n']:.0f})" if row[f"{col}_n"] < row["n"] else ""
    return f"{mean:{fmt}}" + ("" if pd.isna(std) else f" ± {std:{fmt}}") + count


def table_row(row: pd.Series, run: dict[str, Any]) -> list[str]:
    # workers' CPU [cores] is the host workers' busy share: of the host threads the run had
    threads = Mix.from_dict(json_object(run.get("mix"))).host_cores
    sockets = row["workers_cpu_cores_mean"] / threads * 100 if threads else float("nan")
    return [row["method"], f"{row['n']}/{row['runs']}", tau_text(run),
            timed(row, "time_to_0.9"), timed(row, "time_to_0.95"), speedup(row),
            cell(row, "train_loss", ".4f"), cell(row, "test_loss", ".4f"),
            cell(row, "test_acc", ".4f"), cell(row, "share_accel", ".2f"),
            cell(row, "gpu_util", ".0f"), "—" if pd.isna(sockets) else f"{sockets:.0f}",
            PAPER.get(row["method"], "not reported")]


#: The report.csv columns the table reads (``hetsgd report`` writes them all).
REPORT_COLUMNS = (
    "variant", "algo", "dataset", "model", "clock", "baseline", "l_best", "n", "runs", "timed",
    "workers_cpu_cores_mean", "speedup", "speedup_low", "speedup_high", "speedup_bound",
    *(f"time_to_{x}_{part}" for x in (0.9, 0.95) for part in ("mean", "low", "high", "n")),
    *(f"{metric}_{part}" for metric in ("train_loss", "test_loss", "test_acc", "share_accel",
                                        "gpu_util") for part in ("mean", "std", "n")))


def report_command(out: Path) -> str:
    """The command that writes the report.csv the table reads: speedups over sync."""
    return f'`hetsgd report {out} --baseline "{SYNC_BASELINE}"`'


def check_baseline(report: pd.DataFrame, file: Path, out: Path) -> None:
    """A :class:`UserError` where the baseline of a comparison that holds the reproduction's
    methods is not the sync method: the column reads "speedup vs sync", and report.csv's
    speedups are over whatever baseline ``hetsgd report`` was given or chose."""
    comparison = ["dataset", "model", "clock"]
    ours = report.loc[report["method"].notna(), comparison].drop_duplicates()
    bases = report[report["baseline"]].merge(ours, on=comparison)
    other = bases[bases["method"] != "sync"]
    if not other.empty:
        base = other.iloc[0]
        # report.csv puts a ' before a variant that starts with + (a spreadsheet's formula)
        names = [v.removeprefix("'") for v in (base["method"], base["variant"], base["algo"])
                 if isinstance(v, str)]
        name = names[0] if names else "another row"
        raise UserError(f"the speedups in {file} are over {name}, not sync: write it again with "
                        f"{report_command(out)} (as scripts/reproduce_biased_local_sim.sh does)")


#: The columns of REPORT_COLUMNS that are not numbers.
TEXTS = ("variant", "algo", "dataset", "model", "clock", "baseline")


def read_report(out: Path) -> pd.DataFrame:
    """The rows of ``out``'s report.csv for the reproduction's methods, in the paper's order; a
    :class:`UserError` where it cannot be read, lacks a column the table reads, or has no such
    row."""
    file = out / "report.csv"
    try:
        report = pd.read_csv(file)
    except (OSError, ValueError) as err:
        raise UserError(f"cannot read {file} ({report_command(out)} writes it): "
                        f"{one_line(err)}") from err
    lacking = [column for column in REPORT_COLUMNS if column not in report]
    if lacking:
        raise UserError(f"{file} lacks {', '.join(lacking)}: write it again with "
                        f"{report_command(out)}")
    numbers = [c for c in REPORT_COLUMNS if c not in TEXTS]
    report[numbers] = report[numbers].apply(pd.to_numeric, errors="coerce")
    counts = [c for c in numbers if c in ("n", "runs", "timed") or c.endswith("_n")]
    uncounted = [c for c in counts if report[c].isna().any()]
    if uncounted:
        raise UserError(f"{file} has cells that are not counts in {', '.join(uncounted)}")
    report["method"] = report["variant"].map(method_of)
    # a hand-edited cell that is not True reads as not the baseline
    report["baseline"] = report["baseline"].astype(str).str.strip().str.lower() == "true"
    check_baseline(report, file, out)
    report = report[report["method"].notna()]
    if report.empty:
        raise UserError(f"no run of scripts/reproduce_biased_local_sim.sh in {file}: no "
                        f"row has +method= one of {', '.join(ORDER)}")
    return report.sort_values("method", key=lambda m: m.map(ORDER.index))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path, help="a reproduction's folder, after hetsgd report")
    out = parser.parse_args().folder
    runs, model = method_runs(out)
    report = read_report(out)
    rows = [table_row(row, runs.get(row["method"], {})) for _, row in report.iterrows()]
    # tau auto records the profiles' step times (a fixed tau records none)
    steps = json_object(json_object(runs.get("local_unbalanced", {}).get("local_sgd")).get("step_s"))
    profiled = {group: finite_or_none(step) for group, step in steps.items()}
    print(shown(f"{report['dataset'].iloc[0]} · {model.get('name')} {model.get('hidden', '')} on "
                f"paper_biased_local (simulated), L_best = {report['l_best'].iloc[0]:.4g}; times "
                "and speedups: mean [95% Student-t interval] n=k/m over the seeds that have one, "
                "other numbers mean ± std over seeds; t@x: virtual seconds after which a run "
                "stays at normalized loss x or beyond; a step as profiled: "
                + ", ".join(f"{g} {t * 1e3:.3f} ms" for g, t in profiled.items() if t is not None)))
    print(shown(markdown_table(HEADERS, rows), lines=True))


if __name__ == "__main__":
    run_script("biased_local_table", main)
