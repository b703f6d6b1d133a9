"""hetsgd.outputs.paper_table: times and speedups over the GPU alone, where it got there, where it
did not, and where its run cannot say when."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from conftest import said
from test_comparable_rows import edit_summary
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
    # 2.0 ± t(2) · 1.5 / sqrt(3) = 2.0 ± 3.73 reaches below 0, where no time is: cut there
    assert mean_cell([0.5, 2.0, 3.5], ".2f") == "2.00 [0.00, 5.73] n=3"
    assert mean_cell([None, math.nan], ".2f") == "—"
    assert mean_cell([2.0], ".1f", of=3, unit="x") == "2.0x n=1/3"  # one run: no interval
    gpu = row("sync", run(0, 0.4), run(1, 0.2), run(2, 0.3))
    table = paper_table.convergence_table([gpu])
    assert "95% Student-t interval of the mean, cut at 0" in table
    # its time and its speedup over itself; the final loss stays mean ± std
    assert "| 0.300 [0.052, 0.548] n=3 | 1.0x [1.0, 1.0] n=3 | 0.0500 ± 0.0000 |" in table


def test_a_gpu_alone_that_never_got_there_gives_a_lower_bound():
    gpu = row("sync", run(0, None, time_s=0.5), run(1, 0.2))
    hogbatch = row("hogbatch", run(0, 0.01), run(1, 0.1))
    assert paper_table.speedup(hogbatch, gpu, 0.1) == "≥ 2.0x n=2"
    # the bound is the GPU alone's run length (2 s) over the row's time, not the row's own
    # length (0.5 s) over it
    assert paper_table.speedup(row("hogbatch", run(0, 0.5)),
                               row("sync", run(0, None, time_s=2.0)), 0.1) == "≥ 4.0x n=1"


def test_a_run_without_snapshots_between_its_ends_has_no_time_to_a_loss_it_reached():
    blind = run(1, 0.3, snapshots=2)
    assert math.isnan(paper_table.time_to(blind, 0.1))
    assert paper_table.time_to(run(1, None, snapshots=2), 0.1) is None
    gpu = row("sync", run(0, None), blind)
    hogbatch = row("hogbatch", run(0, 0.01), run(1, 0.01))
    assert paper_table.speedup(hogbatch, gpu, 0.1) == "≥ 50x n=1/2"
    assert paper_table.mean_std([math.nan, 0.2], ".2f", 2) == "0.20 (1/2)"


def test_a_seed_at_0_s_or_timed_to_another_target_gives_no_ratio_and_no_error() -> None:
    gpu = row("sync", run(0, 0.2), run(1, 0.0), run(2, 0.4))
    hogbatch = row("hogbatch", run(0, 0.0), run(1, 0.1), run(2, 0.2))
    assert paper_table.speedup(hogbatch, gpu, 0.1) == "2.0x n=1/3"  # seed 2's 0.4 / 0.2 alone
    other = run(1, 0.3)
    other.times = {0.2: 0.3}  # its relative target is not the other seed's
    assert math.isnan(paper_table.time_to(other, 0.1))
    table = paper_table.convergence_table([row("sync", run(0, 0.2), other)])
    assert "| 0.300 n=1/2 | 0.200 n=1/2 |" in table  # targets 0.2, then 0.1
    assert paper_table.mean_std([math.inf, 0.2], ".2f", 2) == "0.20 (1/2)"  # inf: unknown


def test_a_folder_holding_other_runs_costs_each_its_own_line_never_the_tables(
        tmp_path: Path) -> None:
    machine = "paper_hogbatch_v100"

    def one(name: str, algo: str, number: int, **fields: object) -> Path:
        """A run of ``algo`` with seed ``number``, its summary's ``fields`` set as given."""
        return edit_summary(write_run(tmp_path / name, algo=algo, devices=machine, seed=number),
                            **fields)

    for seed in (0, 1):
        one(f"sync_{seed}", "sync", seed)
    # too short for the controller to close a window: it has no last share
    one("adaptive_0", "adaptive", 0,
        adaptive={"target_share": 0.5, "bound": None, "last_window_share": None})
    one("hogwild_2", "hogwild", 2, unstable_losses={"0.1": True})  # not a list: none unstable
    other = write_run(tmp_path / "other\x1b[2J", algo="sync", devices="auto_gpu", seed=0)
    refused = {  # each with one defect
        one("null_share", "hogbatch", 0, update_share=None): "its update_share is not an object",
        one("no_time", "hogbatch", 1, time_s=0): "its time_s is not a positive number",
        one("listed", "hogbatch", 2, adaptive=["\x1b]52;c;bad"]):
            "its adaptive entry is not an object",
        one("text_targets", "hogbatch", 3, target_losses={"losses": ["0.1"], "reference": "x"}):
            "its target_losses.losses is not a list of numbers",
        one("odd_curve", "hogbatch", 4, target_losses={"losses": [1.0], "reference": "x",
                                                       "curve": "\x1b[2J"}):
            "its target_losses.curve is not one of train_loss, test_loss",
        one("no_seed", "hogbatch", 5, seed=None): "its seed is not a number",
    }
    negative = one("negative", "hogwild", 1)
    summary = json.loads((negative / "summary.json").read_text())
    edit_summary(negative, time_to_loss=dict.fromkeys(summary["time_to_loss"], -1.0))
    refused[negative] = "its time_to_loss holds a time that is not a number of seconds"
    no_final = one("no_final", "hogwild", 3)
    edit_summary(no_final, final=None)
    refused[no_final] = "its summary.json has no final.train_loss"
    no_busy = one("no_busy", "hogwild", 0)
    pd.read_csv(no_busy / "workers.csv").drop(columns="busy_s").to_csv(
        no_busy / "workers.csv", index=False)
    refused[no_busy] = "its workers.csv lacks busy_s"

    text, skipped = paper_table.write_tables(tmp_path)

    assert (tmp_path / "paper_table.md").read_text() == text
    assert "| V100 (AWS p3.16xlarge) | GPU alone | 2 |" in text
    assert "| V100 (AWS p3.16xlarge) | CPU Hogwild | 1 |" in text
    assert "| V100 (AWS p3.16xlarge) | Adaptive | 1 |" in text
    assert "| K80 (UC Merced) | CPU Hogwild | 1 |" in text  # the V100's Hogwild runs again
    rows, _ = paper_table.read_rows(tmp_path)
    gpu_alone, = (r for r in rows if r.algo == "sync")
    # the host workers' busy time (3.9 of the run's 4 s; the accelerator's 3.5 s does not enter)
    # and update share (write_run's 95 %)
    assert [r.cpu_busy for r in gpu_alone.runs] == pytest.approx([100 * 3.9 / 4.0] * 2)
    assert [r.cpu_share for r in gpu_alone.runs] == pytest.approx([0.95] * 2)
    assert "Adaptive, V100 (AWS p3.16xlarge), seed 0: last window's GPU share none (no window " \
           "closed) (target 0.5), bound: none" in text
    assert sorted(skipped) == sorted(
        [f"{run_dir}: {why}" for run_dir, why in refused.items()]
        + [f"{shown(other)}: devices=auto_gpu algo=sync is not one of the reproduction's runs "
           "(scripts/reproduce_hogbatch_sim.sh)"])
    # all its runs were left out: no empty row in the shares table (after the caption)
    assert "Hogbatch" not in text.split("\n\n")[1]
    assert "\x1b" not in text


def test_the_command_prints_the_tables_of_what_it_read_and_fails_where_it_read_nothing(
        tmp_path: Path) -> None:
    other = write_run(tmp_path / "other\x1b[2J", algo="sync", devices="auto_gpu", seed=0)
    command = [sys.executable, "-m", "hetsgd.outputs.paper_table", str(tmp_path)]
    ran = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert (ran.returncode, ran.stdout) == (1, "")
    assert said(ran.stderr, "paper_table") == (
        f"paper_table: no completed run of the reproduction under {tmp_path}: 1 run(s) left "
        f"out, the first {shown(other)}: devices=auto_gpu algo=sync is not one of the "
        "reproduction's runs (scripts/reproduce_hogbatch_sim.sh)\n")
    write_run(tmp_path / "sync", algo="sync", devices="paper_hogbatch_v100", seed=0)
    ran = subprocess.run(command, capture_output=True, text=True, timeout=120)
    # the tables, and the run left out
    assert ran.returncode == 1 and said(ran.stderr, "paper_table") == ""
    assert "| V100 (AWS p3.16xlarge) | GPU alone | 1 |" in ran.stdout
    assert f"- {shown(other)}: devices=auto_gpu algo=sync is not one of" in ran.stdout


def test_the_tables_open_with_what_the_runs_were_as_they_say_it(tmp_path: Path) -> None:
    """The caption is read from each run (a script's overrides change the setting it ran):
    per setting of dataset, model, lr and budget, its methods, seeds and runs; escaped."""
    machine = "paper_hogbatch_v100"
    main = ("model: {name: mlp, hidden: [128, 128], activation: relu}\n"
            "optim: {lr: 0.01}\nbudget: {epochs: null, seconds: 0.02}\n")
    for algo, seed in (("sync", 0), ("sync", 1), ("hogbatch", 0), ("hogbatch", 1)):
        run_dir = write_run(tmp_path / f"{algo}_{seed}", algo=algo, devices=machine, seed=seed)
        edit_summary(run_dir, simulated=True)
        (run_dir / "config.yaml").write_text(main)
    net = edit_summary(write_run(tmp_path / "net", algo="adaptive", devices=machine, seed=0,
                                 dataset="w8a\x1b[2J"), simulated=True, model="mlp_paper")
    (net / "config.yaml").write_text("model: {name: mlp_paper}\noptim: {lr: 0.03}\n"
                                     "budget: {epochs: 2, seconds: null}\n")
    write_run(tmp_path / "bare", algo="hogwild", devices=machine, seed=2)  # no config.yaml

    text, skipped = paper_table.write_tables(tmp_path)

    assert skipped == []
    assert text.split("\n\n")[0] == "\n".join([
        "The runs (their summary.json and config.yaml):",  # in the tables' order
        "- digits · mlp (not the paper's net, mlp_paper) · lr not in config.yaml · budget not in "
        "config.yaml: CPU Hogwild; seed 2 (1 run)",
        "- digits · mlp [128, 128] relu (not the paper's net, mlp_paper) · lr 0.01 · "
        "0.02 virtual s: GPU alone, Hogbatch (CPU+GPU); seeds 0, 1 (4 runs)",
        "- w8a\\x1b[2J · mlp_paper · lr 0.03 · 2 epochs: Adaptive; seed 0 (1 run)"])
    assert "\x1b" not in text
