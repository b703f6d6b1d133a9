"""scripts/biased_local_table.py: the reproduction's rows from its report, beside the paper;
another experiment's run in the folder is passed over, and a folder it cannot read is one line
on stderr and status 1."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from conftest import load_script, said
from test_report import table_rows, write_overrides, write_run

from hetsgd.errors import UserError
from hetsgd.outputs.report import write_report

SCRIPT = Path(__file__).parents[1] / "scripts" / "biased_local_table.py"


def _table(folder: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SCRIPT), str(folder)], capture_output=True,
                          text=True, timeout=300)


def _reproduction(folder: Path) -> None:
    """Two seeds of sync and of biased local SGD on the paper's mix, and two of another
    experiment's method (``+method=gpu``) beside them."""
    jobs = [("sync", "sync"), ("local_sgd", "local_biased"), ("sync", "gpu")]
    for job, (algo, method) in enumerate(jobs):
        for seed in (0, 1):
            run_dir = write_run(folder / "sweeps" / "s" / f"{job}{seed}_{method}", algo=algo,
                                devices="paper_biased_local", seed=seed, speed=1 + job + seed / 5)
            write_overrides(run_dir, [f"+method={method}", f"seed={seed}"])
            (run_dir / "config.yaml").write_text("model: {name: mlp, hidden: [8]}\n")


def test_the_table_shows_the_reproductions_methods_and_refuses_other_folders(
        tmp_path: Path) -> None:
    _reproduction(tmp_path)
    missing = _table(tmp_path)
    assert (missing.returncode, missing.stdout) == (1, "")
    assert said(missing.stderr, "biased_local_table").startswith(
        f"biased_local_table: cannot read {tmp_path}/report.csv (`hetsgd report {tmp_path} "
        '--baseline "algo=sync mix.cpu.count=2"` writes it): ')
    assert said(missing.stderr, "biased_local_table").count("\n") == 1

    write_report(tmp_path, baseline="variant=+method=sync")
    shown = _table(tmp_path)
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.startswith("digits · mlp [8] on paper_biased_local (simulated)")
    rows = {row[0]: row for row in table_rows(shown.stdout) if row[0] != "method"}
    assert list(rows) == ["sync", "local_biased"]  # in the paper's order, gpu passed over
    assert rows["sync"][1] == rows["local_biased"][1] == "2/2"
    assert rows["local_biased"][-1] == "up to 32x faster than sync, nearly identical accuracy"
    # the sockets' busy share: the workers' cores over the mix's one host thread
    report = pd.read_csv(tmp_path / "report.csv")
    (cores,) = report.loc[report["variant"].str.endswith("+method=sync"), "workers_cpu_cores_mean"]
    assert rows["sync"][11] == f"{cores * 100:.0f}"
    # the loss cells, each its own column (write_run's test loss is 0.05 above its train loss)
    (sync,) = (row for _, row in report.iterrows() if row["variant"].endswith("+method=sync"))
    assert sync["test_loss_mean"] - sync["train_loss_mean"] == pytest.approx(0.05)
    assert rows["sync"][6].startswith(f"{sync['train_loss_mean']:.4f} ± ")
    assert rows["sync"][7].startswith(f"{sync['test_loss_mean']:.4f} ± ")

    other = tmp_path / "other"
    run_dir = write_run(other / "0_gpu", algo="sync", devices="gpu", seed=0)
    write_overrides(run_dir, ["+method=gpu", "seed=0"])
    write_report(other)
    refused = _table(other)
    assert (refused.returncode, refused.stdout) == (1, "")
    assert said(refused.stderr, "biased_local_table") == (f"biased_local_table: no run of "
                              f"scripts/reproduce_biased_local_sim.sh in {other}/report.csv: no "
                              "row has +method= one of sync, fast_alone, local_balanced, "
                              "local_unbalanced, local_biased\n")


def test_a_report_or_summary_of_another_shape_is_refused_or_read_as_unknown(
        tmp_path: Path) -> None:
    table = load_script(SCRIPT)
    _reproduction(tmp_path)
    write_report(tmp_path, baseline="variant=+method=sync")
    report = pd.read_csv(tmp_path / "report.csv")
    assert list(table.read_report(tmp_path)["method"]) == ["sync", "local_biased"]
    report.drop(columns="l_best").to_csv(tmp_path / "report.csv", index=False)
    with pytest.raises(UserError, match="report.csv lacks l_best: write it again"):
        table.read_report(tmp_path)
    report.assign(timed="two").to_csv(tmp_path / "report.csv", index=False)
    with pytest.raises(UserError, match="has cells that are not counts in timed$"):
        table.read_report(tmp_path)
    # a method without a completed run has no summary to read ({}), and a summary's entries of
    # another shape read as unknown: its row is still shown
    report.to_csv(tmp_path / "report.csv", index=False)
    first = table.read_report(tmp_path).iloc[0]
    for run in ({}, {"local_sgd": "x", "mix": {"cpu": "y"}},
                {"local_sgd": {"tau": None}, "mix": {"cpu": {"role": "host", "count": "2"}}}):
        cells = table.table_row(first, run)
        assert (cells[0], cells[2], cells[11]) == ("sync", "—", "—")
    cells = table.table_row(first, {"local_sgd": {"tau": {"accel": 8, "cpu": 1}},
                                    "mix": {"cpu": {"role": "host", "count": "2", "threads": 2},
                                            "accel": {"role": "accel", "count": 1, "threads": 1}}})
    assert cells[2] == "accel:8 cpu:1"
    assert cells[11] == f"{first['workers_cpu_cores_mean'] / 4 * 100:.0f}"  # 2 x 2 host threads
    # a bound read back as a number (report.csv's True/False, coerced) marks a lower bound
    speedup = {"baseline": False, "speedup": 2.0, "speedup_low": 1.5, "speedup_high": 3.0}
    assert table.speedup(pd.Series({**speedup, "speedup_bound": 1.0})) == "≥ 2.00 [1.50, 3.00]"
    assert table.speedup(pd.Series({**speedup, "speedup_bound": 0.0})) == "2.00 [1.50, 3.00]"


def test_speedups_over_another_baseline_than_sync_are_refused(tmp_path: Path) -> None:
    """The column reads "speedup vs sync": report.csv's speedups over another row (the default
    baseline here is +method=gpu, a sync run too) are one line naming the --baseline to pass,
    and over sync its row reads "baseline"."""
    _reproduction(tmp_path)
    write_report(tmp_path)  # the default baseline
    assert list(pd.read_csv(tmp_path / "report.csv").query("baseline")["variant"]) == [
        "'+method=gpu"]
    refused = _table(tmp_path)
    assert (refused.returncode, refused.stdout) == (1, "")
    assert said(refused.stderr, "biased_local_table") == (
        f"biased_local_table: the speedups in {tmp_path}/report.csv are over +method=gpu, not "
        f'sync: write it again with `hetsgd report {tmp_path} --baseline "algo=sync '
        'mix.cpu.count=2"` (as scripts/reproduce_biased_local_sim.sh does)\n')
    assert "Traceback" not in refused.stderr

    write_report(tmp_path, baseline="variant=+method=sync")
    shown = _table(tmp_path)
    assert shown.returncode == 0, shown.stderr
    rows = {row[0]: row for row in table_rows(shown.stdout) if row[0] != "method"}
    report = pd.read_csv(tmp_path / "report.csv")
    (biased,) = report.loc[report["variant"].str.endswith("+method=local_biased"), "speedup"]
    assert rows["sync"][5] == "baseline"
    assert rows["local_biased"][5].startswith(f"{biased:.2f}")
