"""Only comparable rows share a table: virtual and real time apart, several paths reported
together, settings that differ from the defaults shown, contended runs marked and not timed."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import yaml
from test_report import table_rows, write_run
from typer.testing import CliRunner

from hetsgd.cli import app
from hetsgd.outputs.report import write_report
from hetsgd.outputs.summary import RunSummary
from hetsgd.runs.validate import METRICS, Comparison

STAYS = [2.0, 1.05, 0.1, 0.1]  # normalized 0, 0.5, 1, 1: stays at 0.9 from 1.8 s
SLOW = [2.0, 1.525, 1.05, 0.575, 0.1]  # 0.25 a second: 0.9 at 3.6 s


def edit_summary(run_dir: Path, **fields: Any) -> Path:
    file = run_dir / "summary.json"
    file.write_text(json.dumps({**json.loads(file.read_text()), **fields}))
    return run_dir


def sections(markdown: str) -> dict[str, str]:
    """Each ``## title`` of the report and its text."""
    parts = markdown.split("\n## ")[1:]
    return {part.split("\n", 1)[0]: part for part in parts}


def test_virtual_and_real_runs_never_share_a_table_or_a_best_loss(tmp_path: Path) -> None:
    write_run(tmp_path / "real", algo="sync", devices="gpu", seed=0, train_loss=SLOW)
    # a simulated run of the same dataset and model, whose losses go lower
    edit_summary(write_run(tmp_path / "virtual", algo="sync", devices="gpu", seed=0,
                           train_loss=[2.0, 0.05, 0.05]), simulated=True)
    markdown = write_report(tmp_path)
    found = sections(markdown)
    assert set(found) == {"digits · mlp · real time", "digits · mlp · virtual time"}
    assert "L_best = 0.15" in found["digits · mlp · real time"]  # its own, not the virtual 0.1
    assert "L_best = 0.1," in found["digits · mlp · virtual time"]
    assert "virtual seconds" in found["digits · mlp · virtual time"]
    assert "measured training wall seconds" in found["digits · mlp · real time"]
    numbers = pd.read_csv(tmp_path / "report.csv").set_index("clock")
    # on its own best, as if alone
    assert numbers.at["real", "time_to_0.9_mean"] == pytest.approx(3.6)
    assert numbers.at["virtual", "l_best"] == 0.1


def test_several_paths_are_reported_together_into_the_folder_holding_them(
        tmp_path: Path) -> None:
    write_run(tmp_path / "a" / "sync", algo="sync", devices="gpu", seed=0, train_loss=SLOW)
    write_run(tmp_path / "b" / "hogbatch", algo="hogbatch", devices="cpu+gpu", seed=0,
              train_loss=STAYS)
    write_run(tmp_path / "c" / "left_out", algo="hogwild", devices="cpu", seed=0)
    result = CliRunner().invoke(app, ["report", str(tmp_path / "a"), str(tmp_path / "b")])
    assert result.exit_code == 0, result.output
    markdown = (tmp_path / "report.md").read_text()
    rows = {row[0]: row for row in table_rows(markdown)}
    assert set(rows) == {"sync", "hogbatch"}  # one comparison, c not asked for
    assert rows["hogbatch"][-2] == f"{3.6 / 1.8:.2f}"
    assert f"# hetsgd report: {tmp_path / 'a'}, {tmp_path / 'b'}" in markdown
    missing = CliRunner().invoke(app, ["report", str(tmp_path / "a"), str(tmp_path / "nope")])
    assert missing.exit_code != 0 and "no such run" in missing.output


def test_a_device_mix_lr_and_shared_overrides_are_shown(tmp_path: Path) -> None:
    for algo, lr in (("sync", 0.01), ("hogwild", 0.1)):  # 0.1: the schema's default
        run = write_run(tmp_path / algo, algo=algo, devices="paper_hogbatch_v100", seed=0)
        (run / "config.yaml").write_text(yaml.safe_dump(
            {"algo": {"name": algo}, "optim": {"lr": lr, "momentum": 0.0}}))
        (run / ".hydra").mkdir()
        (run / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(
            [f"algo={algo}", "budget.epochs=3"]))
    markdown = write_report(tmp_path)
    rows = {row[0]: row for row in table_rows(markdown)}
    assert rows["sync"][2] == "optim.lr=0.01" and rows["hogwild"][2] == "—"
    assert "Settings every run shares: budget.epochs=3." in markdown


def test_flagged_runs_are_marked_and_not_timed_unless_kept(tmp_path: Path) -> None:
    for seed in (0, 1):
        write_run(tmp_path / f"sync{seed}", algo="sync", devices="gpu", seed=seed,
                  train_loss=SLOW)
    write_run(tmp_path / "hogbatch0", algo="hogbatch", devices="cpu+gpu", seed=0,
              train_loss=STAYS)
    edit_summary(write_run(tmp_path / "hogbatch1", algo="hogbatch", devices="cpu+gpu", seed=1,
                           train_loss=SLOW),
                 contention={"workers_cpu_share": 0.6, "flagged": True})
    edit_summary(tmp_path / "hogbatch0", contention={"workers_cpu_share": 0.9, "flagged": False})
    rows = {row[0]: row for row in table_rows(write_report(tmp_path))}
    assert rows["hogbatch"][3] == "2/2 completed (1 flagged)"
    assert rows["hogbatch"][4] == "1.80 n=1"  # the flagged seed is not timed
    assert rows["hogbatch"][-2] == f"{3.6 / 1.8:.2f}"
    assert "0.75 ± 0.21" in rows["hogbatch"]  # the workers' CPU share, both runs'
    kept = {row[0]: row for row in table_rows(write_report(tmp_path, keep_flagged=True))}
    half = 12.706204736174707 * 0.9  # t(1) times the standard error of (1.8, 3.6)
    # 2.7 - half is below 0, where no time is: the interval is cut there
    assert kept["hogbatch"][4].startswith(f"2.70 [0.00, {2.7 + half:.2f}] n=2")
    assert kept["hogbatch"][-2].startswith(f"{3.6 / 2.7:.2f} [")
    # a summary without the entry, or with a flag that is not a boolean, is not flagged
    edit_summary(tmp_path / "hogbatch1", contention={"flagged": "yes"})
    assert "flagged" not in {row[0]: row for row in table_rows(write_report(tmp_path))}[
        "hogbatch"][3]


def test_simulated_against_real_shows_each_runs_workers_cpu_share() -> None:
    read = METRICS["workers' CPU share"]
    identity = {"status": "completed", "error": None, "algo": "hogbatch", "dataset": "digits",
                "model": "mlp", "devices": "emulated", "seed": 0}
    real = RunSummary.from_dict({**identity, "contention": {"workers_cpu_share": 0.61,
                                                            "flagged": True}})
    assert read(real) == 0.61
    assert read(RunSummary.from_dict(identity)) is None  # a run that does not record it
    row = Comparison.of("hogbatch", "workers' CPU share", [read(real)], [1.0])
    assert (row.real, row.simulated) == (0.61, 1.0)


def test_a_mixs_runs_with_and_without_a_real_accelerator_are_two_rows(tmp_path: Path) -> None:
    """devices=auto with a GPU and without one (emulated): one name, two machines."""
    for seed in (0, 1):
        write_run(tmp_path / f"gpu{seed}", algo="sync", devices="auto", seed=seed)
        write_run(tmp_path / f"emulated{seed}", algo="sync", devices="auto", seed=seed,
                  speed=2.0, emulated=True)
    write_report(tmp_path)
    numbers = pd.read_csv(tmp_path / "report.csv", keep_default_na=False)
    assert sorted(zip(numbers["variant"], numbers["emulated"], numbers["n"])) == [
        ("", False, 2), ("emulated", True, 2)]
