"""hetsgd.outputs.paper_table: times and speedups over the GPU alone, where it got there, where it
did not, and where its run cannot say when."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pandas as pd
from test_report import write_run

from hetsgd.outputs import paper_table
from hetsgd.outputs.cells import mean_cell
from hetsgd.outputs.safe_text import shown


def run(seed: int, reached: float | None, snapshots: int = 50, time_s: float = 0.5):
    return paper_table.Run(seed=seed, time_s=time_s, cpu_share=1.0, gpu_util=None, cpu_busy=100.0,
                           final_loss=0.05, times={0.1: reached}, snapshots=snapshots,
                           adaptive=None, final_batches={})


def row(algo: str, *runs):
    return paper_table.Row("paper_hogbatch_v100", algo, list(runs))


def test_speedup_is_the_geometric_mean_of_per_seed_ratios_with_its_interval_and_n():
    gpu = row("sync", run(0, 0.8), run(1, 0.2), run(2, 0.4))
    hogbatch = row("hogbatch", run(0, 0.1), run(1, 0.1), run(2, 0.1))
    # ratios 8, 2 and 4: log2 of them 3, 1 and 2, mean 2 ± t(2) * 1 / sqrt(3), t(2) = 4.3027...;
    # geometric mean 4 (the arithmetic one, 4.7, would be pulled up by the largest seed)
    half = 4.302652729911275 / math.sqrt(3) * math.log(2)
    assert paper_table.speedup(hogbatch, gpu, 0.1) == \
        f"4.0x [{4 * math.exp(-half):.1f}, {4 * math.exp(half):.1f}] n=3" == "4.0x [0.7, 22.4] n=3"
    one = row("hogbatch", run(0, 0.1), run(1, None), run(2, None))  # two never got there
    assert paper_table.speedup(one, gpu, 0.1) == "8.0x n=1/3"  # one ratio: no interval


def test_times_show_the_interval_and_the_seeds_that_have_one():
    # mean 0.3 ± t(2) * 0.1 / sqrt(3), t(2) = 4.3027...
    assert mean_cell([0.2, 0.4, 0.3, None], ".2f") == "0.30 [0.05, 0.55] n=3/4"
    assert mean_cell([0.25, 0.25], ".2f") == "0.25 [0.25, 0.25] n=2"
    assert mean_cell([None, math.nan], ".2f") == "—"
    assert mean_cell([2.0], ".1f", of=3, unit="x") == "2.0x n=1/3"  # one run: no interval
    gpu = row("sync", run(0, 0.4), run(1, 0.2), run(2, 0.3))
    table = paper_table.convergence_table([gpu])
    assert "95% Student-t interval of the mean" in table
    # its time and its speedup over itself; the final loss stays mean ± std
    assert "| 0.300 [0.052, 0.548] n=3 | 1.0x [1.0, 1.0] n=3 | 0.0500 ± 0.0000 |" in table


def test_a_gpu_alone_that_never_got_there_gives_a_lower_bound():
    gpu = row("sync", run(0, None, time_s=0.5), run(1, 0.2))
    hogbatch = row("hogbatch", run(0, 0.01), run(1, 0.1))
    assert paper_table.speedup(hogbatch, gpu, 0.1) == "≥ 2.0x n=2"


def test_a_run_without_snapshots_between_its_ends_has_no_time_to_a_loss_it_reached():
    blind = run(1, 0.3, snapshots=2)
    assert math.isnan(paper_table.time_to(blind, 0.1))
    assert paper_table.time_to(run(1, None, snapshots=2), 0.1) is None
    gpu = row("sync", run(0, None), blind)
    hogbatch = row("hogbatch", run(0, 0.01), run(1, 0.01))
    assert paper_table.speedup(hogbatch, gpu, 0.1) == "≥ 50x n=1/2"
    assert paper_table.mean_std([math.nan, 0.2], ".2f", 2) == "0.20 (1/2)"


def _edit_summary(run_dir: Path, **changes: object) -> None:
    file = run_dir / "summary.json"
    summary = json.loads(file.read_text())
    for key, value in changes.items():
        if value is None:
            summary.pop(key)
        else:
            summary[key] = value
    file.write_text(json.dumps(summary))


def test_a_folder_holding_other_runs_costs_each_its_own_line_never_the_tables(
        tmp_path: Path) -> None:
    machine = "paper_hogbatch_v100"
    for seed in (0, 1):
        write_run(tmp_path / f"sync_{seed}", algo="sync", devices=machine, seed=seed)
    adaptive = write_run(tmp_path / "adaptive_0", algo="adaptive", devices=machine, seed=0)
    # too short for the controller to close a window: it has no last share
    _edit_summary(adaptive, adaptive={"target_share": 0.5, "bound": None,
                                      "last_window_share": None})
    other = write_run(tmp_path / "other", algo="sync", devices="auto_gpu", seed=0)
    no_share = write_run(tmp_path / "no_share", algo="hogbatch", devices=machine, seed=0)
    _edit_summary(no_share, update_share=None)
    no_busy = write_run(tmp_path / "no_busy", algo="hogwild", devices=machine, seed=0)
    workers = pd.read_csv(no_busy / "workers.csv").drop(columns="busy_s")
    workers.to_csv(no_busy / "workers.csv", index=False)
    odd = write_run(tmp_path / "odd", algo="hogbatch", devices=machine, seed=1)
    _edit_summary(odd, adaptive=["\x1b]52;c;bad"], time_s=0)
    text_targets = write_run(tmp_path / "text_targets", algo="hogbatch", devices=machine, seed=2)
    _edit_summary(text_targets, target_losses={"losses": ["0.1"], "reference": "by hand"},
                  unstable_losses={"0.1": True})

    text, skipped = paper_table.write_tables(tmp_path)

    assert (tmp_path / "paper_table.md").read_text() == text
    assert "| V100 (AWS p3.16xlarge) | GPU alone | 2 |" in text
    assert "| V100 (AWS p3.16xlarge) | Adaptive | 1 |" in text
    assert "Adaptive, V100 (AWS p3.16xlarge), seed 0: last window's GPU share none (no window " \
           "closed) (target 0.5), bound: none" in text
    assert sorted(skipped) == sorted([
        f"{no_busy}: its workers.csv lacks busy_s",
        f"{no_share}: its summary.json has no update_share",
        f"{odd}: its time_s is not a positive number",
        f"{text_targets}: its target_losses.losses is not a list of numbers",
        f"{other}: devices=auto_gpu algo=sync is not one of the reproduction's runs "
        "(scripts/reproduce_hogbatch_sim.sh)"])
    assert "Hogbatch" not in text.split("\n\n")[0]  # its two runs were left out, no empty row


def test_a_folder_without_a_run_of_the_reproduction_is_a_one_line_error(tmp_path: Path) -> None:
    other = write_run(tmp_path / "other\x1b[2J", algo="sync", devices="auto_gpu", seed=0)
    ran = subprocess.run([sys.executable, "-m", "hetsgd.outputs.paper_table", str(tmp_path)],
                         capture_output=True, text=True, timeout=120)
    assert (ran.returncode, ran.stdout) == (1, "")
    assert ran.stderr == (
        f"paper_table: no completed run of the reproduction under {tmp_path}: 1 run(s) left "
        f"out, the first {shown(other)}: devices=auto_gpu algo=sync is not one of the "
        "reproduction's runs (scripts/reproduce_hogbatch_sim.sh)\n")
