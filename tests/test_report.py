"""The report from hand-made run directories laid out as docs/architecture.md describes.

The fixture writers here are shared with ``test_plots.py``.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from omegaconf import OmegaConf

from hetsgd.errors import UserError
from hetsgd.outputs.comparison import comparisons
from hetsgd.outputs.index import index_runs, load_csv
from hetsgd.outputs.metrics import crossing, loss_key, target_losses, time_to_losses
from hetsgd.outputs.plots import plot_comparison
from hetsgd.outputs.report import write_report
from hetsgd.outputs.summary import GroupMix, Losses, Mix, RunSummary, TargetLosses
from hetsgd.outputs.sweep import SweepReport

ALGOS = {"sync": 1.0, "adaptive": 2.0}  # algo -> speed of its loss decay (1/s)
MIXES = {"cpu+gpu": False, "auto": True}  # device mix -> emulated
SEEDS = (0, 1)


def write_overrides(run_dir: Path, overrides: list[str]) -> None:
    (run_dir / ".hydra").mkdir(parents=True, exist_ok=True)
    (run_dir / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(overrides))


def write_failed(run_dir: Path, *, algo: str, devices: str, seed: int, error: str,
                 dataset: str = "digits") -> Path:
    """A failed run: only summary.json, with its identity and error."""
    run_dir.mkdir(parents=True, exist_ok=True)
    summary = RunSummary(status="failed", error=error, algo=algo, dataset=dataset, model="mlp",
                         devices=devices, seed=seed).to_dict()
    (run_dir / "summary.json").write_text(json.dumps(summary))
    return run_dir


def write_run(run_dir: Path, *, algo: str, devices: str, seed: int, speed: float = 1.0,
              emulated: bool = False, dataset: str = "digits",
              train_loss: list[float] | None = None) -> Path:
    """A completed run with every file a real one has: the loss decays at ``speed`` per second
    towards 0.1 from 2.3 (or follows ``train_loss``, one snapshot a second)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    gpu = not MIXES.get(devices, devices != "auto")
    if train_loss is None:
        t = np.linspace(0.0, 4.0, 17)
        loss = 0.1 + 2.2 * np.exp(-speed * t) + rng.normal(0, 0.01, t.size) * (t > 0)
    else:
        t, loss = np.arange(len(train_loss), dtype=float), np.asarray(train_loss)
    epoch = t * 0.75
    updates = np.round(t * 100 * speed).astype(int)
    cpu_updates = np.round(updates * (0.6 if algo == "adaptive" else 0.95)).astype(int)
    acc = 0.1 + 0.85 * (1 - np.exp(-speed * t))
    conv = pd.DataFrame({
        "time_s": t, "epoch": epoch, "updates": updates, "updates_cpu": cpu_updates,
        "updates_accel": updates - cpu_updates, "train_loss": loss, "test_loss": loss + 0.05,
        "test_acc": acc})
    conv.to_csv(run_dir / "convergence.csv", index=False)
    ut = np.arange(0.0, t[-1] + 0.01, 0.25)
    dip = (np.abs(ut * 0.75 - np.round(ut * 0.75)) < 0.1) & (ut > 0)  # epoch ends
    util = pd.DataFrame({"time_s": ut, "host_cpu_percent": np.where(dip, 20.0, 85.0),
                         "cpu0_percent": 90.0, "cpu1_percent": 80.0,
                         "workers_cpu_percent": np.where(dip, 15.0, 160.0)})
    if gpu:
        util["gpu0_util"] = np.where(dip, 40.0, 95.0)
        util["gpu0_mem_mb"] = 812.0
    util.to_csv(run_dir / "utilization.csv", index=False)
    pd.DataFrame([
        {"worker": 0, "group": "accel", "device": "cuda:0" if gpu else "cpu",
         "kind": "cuda" if gpu else "emulated", "threads": 1, "first_batch": 256,
         "last_batch": 256, "updates": int(updates[-1] - cpu_updates[-1]), "examples": 1000,
         "busy_s": 3.5, "wait_s": 0.2, "comm_s": 0.3},
        {"worker": 1, "group": "cpu", "device": "cpu", "kind": "cpu", "threads": 1,
         "first_batch": 16, "last_batch": 16, "updates": int(cpu_updates[-1]),
         "examples": 1000, "busy_s": 3.9, "wait_s": 0.0, "comm_s": 0.1}]).to_csv(
        run_dir / "workers.csv", index=False)
    if algo == "adaptive":
        pd.DataFrame({"time_s": [0.0, 1.0, 2.0, 0.0, 1.5], "worker": [0, 0, 0, 1, 1],
                      "group": ["accel"] * 3 + ["cpu"] * 2,
                      "batch_size": [256, 512, 1024, 16, 32]}).to_csv(
            run_dir / "batches.csv", index=False)
    updates_by_group = {"cpu": int(cpu_updates[-1]), "accel": int(updates[-1] - cpu_updates[-1])}
    targets = [loss[0] / 2, loss[0] / 5, loss[0] / 10]
    groups = {"accel": GroupMix(label="cuda" if gpu else "emulated", role="accel", count=1,
                                threads=1, batch_size=256, devices=["cuda:0" if gpu else "cpu"]),
              "cpu": GroupMix(label="cpu", role="host", count=1, threads=1, batch_size=16,
                              devices=["cpu"])}
    workers_cores = float(util["workers_cpu_percent"].mean()) / 100
    summary = RunSummary(
        status="completed", error=None, algo=algo, dataset=dataset, model="mlp",
        devices=devices, seed=seed, time_s=float(t[-1]), epochs=float(epoch[-1]),
        examples=2000, updates=int(updates[-1]), updates_by_group=updates_by_group,
        update_share={"cpu": cpu_updates[-1] / updates[-1],
                      "accel": 1 - cpu_updates[-1] / updates[-1]},
        examples_per_s=500.0,
        initial=Losses(float(loss[0]), float(loss[0] + 0.05), 0.1),
        final=Losses(float(loss[-1]), float(loss[-1] + 0.05), float(acc[-1])),
        target_losses=TargetLosses(targets, "0.5 / 0.2 / 0.1 x the initial training loss"),
        time_to_loss={loss_key(targets[0]): 1.0, loss_key(targets[1]): 1.5,
                      loss_key(targets[2]): None},
        mix=Mix(groups),
        utilization={
            "workers_cpu_cores_mean": workers_cores,
            "workers_cpu_share_mean": workers_cores / 2,
            "host_cpu_percent_mean": float(util["host_cpu_percent"].mean()),
            "gpu_util_mean": float(util["gpu0_util"].mean()) if gpu else None},
        emulated=emulated,
        environment={"torch": "2.13", "python": "3.11", "cpu_model": "test", "cores": 2,
                     "gpus": ["H200"] if gpu else [], "driver": None},
        run_dir=str(run_dir)).to_dict()
    (run_dir / "summary.json").write_text(json.dumps(summary))
    return run_dir


def write_sweep(sweep_dir: Path, *, failed: bool = True, crashed: bool = False) -> Path:
    """A sweep of 2 algos x 2 device mixes x 2 seeds on digits, plus a failed job (summary.json
    only) and, if ``crashed``, a job that died before writing anything but ``.hydra/``."""
    sweep_dir.mkdir(parents=True, exist_ok=True)
    (sweep_dir / "multirun.yaml").write_text("hydra: {mode: MULTIRUN}\n")
    job = 0
    for algo, speed in ALGOS.items():
        for devices, emulated in MIXES.items():
            for seed in SEEDS:
                overrides = [f"algo={algo}", f"devices={devices}", f"seed={seed}"]
                run_dir = sweep_dir / f"{job}_{','.join(overrides)}"
                write_run(run_dir, algo=algo, devices=devices, seed=seed, emulated=emulated,
                          speed=speed * (1.5 if devices == "cpu+gpu" else 1.0) * (1 + seed / 10))
                write_overrides(run_dir, overrides)
                job += 1
    extra = []
    if failed:
        extra.append(("hogbatch", "CUDA error: out of memory"))
    if crashed:
        extra.append(("local_sgd", None))
    for algo, error in extra:
        overrides = [f"algo={algo}", "devices=cpu+gpu", "seed=0"]
        run_dir = sweep_dir / f"{job}_{','.join(overrides)}"
        if error:
            write_failed(run_dir, algo=algo, devices="cpu+gpu", seed=0, error=error)
        write_overrides(run_dir, overrides)
        job += 1
    return sweep_dir


def write_broken_runs(results: Path) -> Path:
    """One good run, one with a corrupt convergence.csv, one killed before its summary (only
    config.yaml) and one whose summary still says running."""
    write_run(results / "good", algo="sync", devices="gpu", seed=0)
    corrupt = write_run(results / "corrupt", algo="adaptive", devices="gpu", seed=0)
    (corrupt / "convergence.csv").write_bytes(b"time_s,epo\x00\xff\xfe")
    killed = results / "killed"
    killed.mkdir(parents=True)
    (killed / "config.yaml").write_text(yaml.safe_dump(
        {"algo": {"name": "hogbatch"}, "dataset": {"name": "digits"}, "model": {"name": "mlp"},
         "devices": {"name": "gpu"}, "seed": 1}))
    running = write_failed(results / "running", algo="local_sgd", devices="gpu", seed=2,
                           error="")
    (running / "summary.json").write_text(json.dumps(RunSummary(
        status="running", error=None, algo="local_sgd", dataset="digits", model="mlp",
        devices="gpu", seed=2).to_dict()))
    return results


def table_rows(markdown: str) -> list[list[str]]:
    """The body rows of the markdown tables, as lists of cells."""
    lines = [line for line in markdown.splitlines() if line.startswith("| ")]
    rows = [[c.strip() for c in line.strip("|").split(" | ")] for line in lines]
    return [row for row in rows if row[0] not in ("algo", "---")]


def test_one_row_per_algo_and_devices_with_mean_and_std(tmp_path: Path) -> None:
    sweep = write_sweep(tmp_path / "sweep")
    markdown = write_report(sweep)
    rows = table_rows(markdown)
    keys = sorted((row[0], row[1]) for row in rows)
    assert keys == sorted([("sync", "cpu+gpu"), ("sync", "auto (emulated)"),
                           ("adaptive", "cpu+gpu"), ("adaptive", "auto (emulated)"),
                           ("hogbatch", "cpu+gpu")])
    complete = [row for row in rows if row[0] != "hogbatch"]
    assert all(row[2] == "2" and row[3] == "2/2 completed" for row in complete)
    assert all(row[4].endswith(" n=2") and " [" in row[4] for row in complete)  # interval
    assert (sweep / "report.md").read_text() == markdown
    numbers = pd.read_csv(sweep / "report.csv")
    assert len(numbers) == 5
    assert {"time_to_0.9_mean", "time_to_0.9_low", "time_to_0.9_high", "share_cpu_mean",
            "speedup", "speedup_low", "speedup_high", "verdict", "clock"} <= set(numbers)


def test_a_run_under_two_of_the_paths_is_counted_once(tmp_path: Path) -> None:
    """`hetsgd report results results/sweeps/X`: counted twice, each seed would be two, and
    every interval narrower than its runs allow."""
    sweep = write_sweep(tmp_path / "sweep")
    alone = table_rows(write_report(sweep))
    both = write_report([tmp_path, sweep, sweep / ".." / "sweep"])
    assert table_rows(both) == alone
    assert all(row[2] != "4" for row in table_rows(both))


def test_utilization_is_the_runs_own_and_the_host_is_labelled_apart(tmp_path: Path) -> None:
    sweep = write_sweep(tmp_path / "sweep", failed=False)
    markdown = write_report(sweep)
    header = next(line for line in markdown.splitlines() if line.startswith("| algo"))
    headers = [c.strip() for c in header.strip("|").split(" | ")]
    assert headers[-6:] == ["workers' CPU [cores]", "GPU util [%]", "host CPU [%]",
                            "snapshot spacing [s]", "speedup", "vs baseline"]
    util = pd.read_csv(sweep / "0_algo=sync,devices=cpu+gpu,seed=0" / "utilization.csv")
    workers_cores = util["workers_cpu_percent"].mean() / 100  # 100 = one core
    numbers = pd.read_csv(sweep / "report.csv").set_index(["algo", "devices"])
    real, emulated = numbers.loc[("sync", "cpu+gpu")], numbers.loc[("sync", "auto")]
    assert real["workers_cpu_cores_mean"] == pytest.approx(workers_cores)
    assert real["host_cpu_mean"] == pytest.approx(util["host_cpu_percent"].mean())
    assert real["gpu_util_mean"] == pytest.approx(util["gpu0_util"].mean())
    assert math.isnan(emulated["gpu_util_mean"])  # no GPU of its own: no number
    row = next(r for r in table_rows(markdown) if r[:2] == ["sync", "cpu+gpu"])
    assert row[-6].startswith(f"{workers_cores:.1f}")
    assert row[-4].startswith(f"{util['host_cpu_percent'].mean():.0f}")
    assert row[-3] == "0.250 ± 0.000"  # write_run's 17 snapshots over 4 s

    SweepReport().on_multirun_end(OmegaConf.create({"hydra": {"sweep": {"dir": str(sweep)}}}))
    summary = pd.read_csv(sweep / "summary.csv").set_index("job")
    assert summary.loc[0, "utilization.workers_cpu_cores_mean"] == pytest.approx(workers_cores)
    assert summary.loc[0, "utilization.workers_cpu_share_mean"] == pytest.approx(workers_cores / 2)
    assert summary.loc[0, "utilization.host_cpu_percent_mean"] == pytest.approx(
        util["host_cpu_percent"].mean())
    assert summary.loc[0, "utilization.gpu_util_mean"] == pytest.approx(util["gpu0_util"].mean())


def test_failed_run_is_listed_with_its_error(tmp_path: Path) -> None:
    markdown = write_report(write_sweep(tmp_path / "sweep"))
    failed_row = next(row for row in table_rows(markdown) if row[0] == "hogbatch")
    assert failed_row[2] == "0" and failed_row[3] == "0/1 completed, 1 failed"
    section = markdown.split("## Failed runs", 1)[1]
    assert "CUDA error: out of memory" in section and "algo=hogbatch" in section


def test_baseline_row_has_speedup_one_and_others_are_relative_to_it(tmp_path: Path) -> None:
    sweep = write_sweep(tmp_path / "sweep")
    write_report(sweep)
    numbers = pd.read_csv(sweep / "report.csv").set_index(["algo", "devices"])
    base = numbers.loc[("sync", "auto")]  # default: the first sync row
    assert base["baseline"] and math.isnan(base["speedup"])  # no ratio of a row to itself
    fast = numbers.loc[("adaptive", "auto")]
    assert fast["speedup"] == pytest.approx(base["time_to_0.9_mean"] / fast["time_to_0.9_mean"])
    assert fast["speedup"] > 1.5  # the fixture's adaptive decays twice as fast
    assert fast["speedup_low"] < fast["speedup"] < fast["speedup_high"]
    assert fast["verdict"] == "faster"
    sync_row = next(r for r in table_rows((sweep / "report.md").read_text())
                    if r[:2] == ["sync", "auto (emulated)"])
    assert sync_row[-2:] == ["baseline", "—"]


def test_baseline_selector(tmp_path: Path) -> None:
    sweep = write_sweep(tmp_path / "sweep")
    # the second key decides: algo=adaptive alone matches adaptive · auto first
    markdown = write_report(sweep, baseline="algo=adaptive devices=cpu+gpu")
    assert "baseline: adaptive · cpu+gpu" in markdown
    numbers = pd.read_csv(sweep / "report.csv").set_index(["algo", "devices"])
    assert numbers.loc[("adaptive", "cpu+gpu"), "baseline"]
    assert not numbers.loc[("adaptive", "auto"), "baseline"]
    assert numbers.loc[("sync", "auto"), "speedup"] < 1.0
    with pytest.raises(UserError, match=r"not a summary.json key.*variant=\+method=sync"):
        write_report(sweep, baseline="colour=red")
    with pytest.raises(UserError, match="key=value"):
        write_report(sweep, baseline="sync")
    before = (sweep / "report.md").read_text()
    with pytest.raises(UserError, match="^baseline 'algo=nope' matches no completed run of any "
                                        "comparison$"):  # a typo: it wrote a report, exit 0
        write_report(sweep, baseline="algo=nope")
    assert (sweep / "report.md").read_text() == before


def test_normalized_loss_uses_the_comparison_wide_best(tmp_path: Path) -> None:
    fast = write_run(tmp_path / "a", algo="hogbatch", devices="gpu", seed=0,
                     train_loss=[2.0, 1.0, 0.5])
    write_run(tmp_path / "b", algo="sync", devices="gpu", seed=0, train_loss=[2.0, 1.5, 1.0])
    (comp,) = comparisons(index_runs(tmp_path))
    # timed on the test loss, which write_run puts 0.05 above the training loss
    assert comp.loss == "test_loss" and comp.l_best == pytest.approx(0.55)
    slow = comp.curves[str(tmp_path / "b")]["normalized"]
    assert slow.tolist() == pytest.approx([0.0, 1 / 3, 2 / 3])  # its own best would give 1.0
    write_report(tmp_path)
    numbers = pd.read_csv(tmp_path / "report.csv").set_index("algo")
    # 0.9 lies between the snapshots at 1 s (2/3) and 2 s (1.0): 1 + (0.9 - 2/3) / (1/3) = 1.7
    assert numbers.loc["hogbatch", "time_to_0.9_mean"] == pytest.approx(1.7)
    assert numbers.loc["hogbatch", "epochs_to_0.9_mean"] == pytest.approx(1.7 * 0.75)
    assert math.isnan(numbers.loc["sync", "time_to_0.9_mean"])  # never reached: "—"
    assert fast.name == "a"


def test_overrides_shared_by_every_run_do_not_split_rows(tmp_path: Path) -> None:
    for name, extra in (("a", ["progress=false"]), ("b", []), ("c", ["+optim.lr=0.5"])):
        run = write_run(tmp_path / name, algo="sync", devices="gpu", seed=0)
        write_overrides(run, ["algo=sync", "budget.epochs=3", *extra])
    rows = table_rows(write_report(tmp_path))
    assert [(row[2], row[3]) for row in rows] == [("—", "2"), ("+optim.lr=0.5", "1")]


def test_crossing_interpolates_and_skips_missing_values() -> None:
    assert crossing([0, 1, 2], [0.0, 0.5, 1.0], 0.75) == pytest.approx(1.5)
    assert crossing([0, 1, 2], [0.0, float("nan"), 1.0], 0.9) == 2.0
    assert crossing([0, 1], [0.0, 0.5], 0.9) is None


def test_comparisons_are_split_by_dataset(tmp_path: Path) -> None:
    write_run(tmp_path / "a", algo="sync", devices="gpu", seed=0)
    write_run(tmp_path / "b", algo="sync", devices="gpu", seed=0, dataset="w8a")
    markdown = write_report(tmp_path)
    assert "## digits · mlp" in markdown and "## w8a · mlp" in markdown
    assert "Failed runs" not in markdown


def test_runs_on_other_data_are_another_comparison(tmp_path: Path) -> None:
    """A sweep over dataset.n_classes=2,10 was one comparison: the 10-class runs scaled by the
    2-class runs' best loss, and the baseline of the other task. The data is what config.yaml
    says (an experiment's file may set it), not the overrides."""
    for name, classes, speed in (("two", 2, 2.0), ("ten", 10, 1.0)):
        for algo in ("sync", "hogwild"):
            run_dir = write_run(tmp_path / f"{name}_{algo}", algo=algo, devices="cpu", seed=0,
                                speed=speed, dataset="synthetic")
            dataset = {"name": "synthetic", "n_classes": classes, "limit": None}
            if algo == "hogwild":  # written before the key existed: no difference
                dataset["split_seed"] = 0
            (run_dir / "config.yaml").write_text(yaml.safe_dump({"dataset": dataset}))
    comps = comparisons(index_runs(tmp_path))
    assert [comp.dataset for comp in comps] == ["synthetic [dataset.n_classes=10]",
                                                "synthetic [dataset.n_classes=2]"]
    for comp in comps:
        assert sorted(comp.runs["algo"]) == ["hogwild", "sync"]
        assert comp.l_best == pytest.approx(min(float(curve["test_loss"].min())
                                                for curve in comp.curves.values()))
    assert comps[0].l_best != comps[1].l_best
    names = [path.name for path in plot_comparison(index_runs(tmp_path), tmp_path / "figures")]
    shutil.rmtree(tmp_path / "figures")
    assert len(set(names)) == len(names)  # each comparison's own figures, none overwritten
    assert {"loss_vs_time_synthetic__dataset.n_classes_10_.png",
            "loss_vs_time_synthetic__dataset.n_classes_2_.png"} <= set(names)
    for run_dir in tmp_path.glob("two_*"):  # data that every run of the label shares: its name
        shutil.rmtree(run_dir)
    assert [comp.dataset for comp in comparisons(index_runs(tmp_path))] == ["synthetic"]


def test_bad_paths_and_files_are_user_errors(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="not a directory"):
        write_report(tmp_path / "missing")
    with pytest.raises(UserError, match="no runs under"):
        write_report(tmp_path)
    run = write_run(tmp_path / "run", algo="sync", devices="gpu", seed=0)
    (run / "convergence.csv").write_text("time_s,epoch\n0,0\n")
    with pytest.raises(UserError, match="lacks the column"):
        load_csv(run, "convergence")
    # a header alone (a run too short for a utilization sample) is no table, not a bad one
    (run / "utilization.csv").write_text("time_s,host_cpu_percent,workers_cpu_percent")
    assert load_csv(run, "utilization") is None
    (run / "summary.json").write_text("{not json")
    index = index_runs(tmp_path)
    assert index.loc[0, "status"] == "failed" and "unreadable" in index.loc[0, "error"]


@pytest.mark.parametrize("damage", ["missing", "empty", "header"])
def test_a_completed_run_without_its_curve_is_unusable_not_slow(tmp_path: Path,
                                                                damage: str) -> None:
    """A completed run evaluated its first and last snapshot at least: a curve that is gone is
    damage, named, and never a run that did not reach the target, which would make every
    speedup over it a lower bound."""
    results = tmp_path / "results"
    for seed in (0, 1):
        write_run(results / f"sync_{seed}", algo="sync", devices="gpu", seed=seed)
        write_run(results / f"hogwild_{seed}", algo="hogwild", devices="gpu", seed=seed, speed=2)
    curve = results / "sync_1" / "convergence.csv"
    {"missing": curve.unlink, "empty": lambda: curve.write_text(""),
     "header": lambda: curve.write_text("time_s,epoch,updates,train_loss\n")}[damage]()
    markdown = write_report(results)
    rows = {row[0]: row for row in table_rows(markdown)}
    assert rows["sync"][2:4] == ["1", "1/2 completed, 1 unusable"]
    assert "≥" not in markdown and "never stayed" not in markdown
    failed = markdown.split("## Failed runs", 1)[1]
    assert f"{curve} is missing or holds no training loss" in failed


def test_one_bad_run_costs_only_its_own_row(tmp_path: Path) -> None:
    results = write_broken_runs(tmp_path / "results")
    markdown = write_report(results)
    assert markdown == (results / "report.md").read_text()
    rows = {row[0]: row for row in table_rows(markdown)}
    assert rows["sync"][2:4] == ["1", "1/1 completed"] and rows["sync"][4] != "—"
    assert rows["adaptive"][2:4] == ["0", "0/1 completed, 1 unusable"]
    assert rows["hogbatch"][2:4] == ["0", "0/1 completed, 1 crashed"]
    assert rows["local_sgd"][2:4] == ["0", "0/1 completed, 1 crashed"]
    failed = markdown.split("## Failed runs", 1)[1]
    lines = {line.split("`")[1]: line for line in failed.splitlines() if line.startswith("- ")}
    assert set(lines) == {"corrupt", "killed", "running"}
    assert "**unusable**: cannot read" in lines["corrupt"]
    assert "corrupt/convergence.csv" in lines["corrupt"]
    assert "**crashed**: no summary.json" in lines["killed"]
    assert "algo hogbatch" in lines["killed"] and "seed 1" in lines["killed"]
    assert "**crashed**: summary.json still says 'running'" in lines["running"]
    numbers = pd.read_csv(results / "report.csv").set_index("algo")
    assert numbers.loc["sync", "n"] == 1 and numbers.loc["adaptive", "n"] == 0
    index = index_runs(results)
    assert sorted(index["status"]) == ["completed", "completed", "crashed", "crashed"]
    (results / "corrupt" / "convergence.csv").write_text("time_s,epoch,train_loss\n0,0,oops\n")
    assert "has values that are not numbers in train_loss" in write_report(results)


def test_sweep_report_lists_every_job_and_prints_the_table(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    sweep = write_sweep(tmp_path / "sweep", crashed=True)
    config = OmegaConf.create({"hydra": {"sweep": {"dir": str(sweep)}}})
    SweepReport().on_multirun_end(config)
    summary = pd.read_csv(sweep / "summary.csv").set_index("job")
    assert list(summary.index) == list(range(10))
    assert (summary.loc[:7, "status"] == "completed").all()
    assert summary.loc[8, "status"] == "failed"
    assert summary.loc[8, "error"] == "CUDA error: out of memory"
    assert summary.loc[9, "status"] == "crashed" and "no summary.json" in summary.loc[9, "error"]
    assert summary.loc[8, "overrides"] == "algo=hogbatch devices=cpu+gpu seed=0"
    report = (sweep / "report.md").read_text()
    assert "CUDA error: out of memory" in report
    assert "`9_algo=local_sgd,devices=cpu+gpu,seed=0` (): **crashed**: no summary.json" in report
    assert (sweep / "report.csv").exists()
    assert (sweep / "figures" / "loss_vs_time_digits.png").exists()
    out = capsys.readouterr().out
    assert "| sync | cpu+gpu | 2 | 2/2 completed |" in out


def test_sweep_report_never_raises(tmp_path: Path) -> None:
    sweep = tmp_path / "sweep"
    write_failed(sweep / "0_algo=sync", algo="sync", devices="gpu", seed=0, error="boom")
    write_overrides(sweep / "1_algo=hogbatch", ["algo=hogbatch"])
    SweepReport().on_multirun_end(OmegaConf.create({"hydra": {"sweep": {"dir": str(sweep)}}}))
    summary = pd.read_csv(sweep / "summary.csv")
    assert summary["status"].tolist() == ["failed", "crashed"]
    assert summary["error"].iloc[0] == "boom"
    assert "boom" in (sweep / "report.md").read_text()
    for where in (tmp_path / "none", tmp_path / "empty"):
        (tmp_path / "empty").mkdir(exist_ok=True)
        SweepReport().on_multirun_end(OmegaConf.create({"hydra": {"sweep": {"dir": str(where)}}}))
    assert "no runs under" in (tmp_path / "empty" / "report.md").read_text()
    (sweep / "0_algo=sync" / "summary.json").write_text("[1, 2]")
    SweepReport().on_multirun_end(OmegaConf.create({"hydra": {"sweep": {"dir": str(sweep)}}}))
    assert "unreadable summary.json" in (sweep / "report.md").read_text()


def test_a_run_is_timed_to_absolute_losses() -> None:
    time, loss = [0.0, 1.0, 2.0, 3.0], [1.0, 0.6, 0.3, 0.05]
    targets, reference = target_losses([], initial_loss=1.0)
    assert targets == pytest.approx([0.5, 0.2, 0.1])
    assert reference == "0.5 / 0.2 / 0.1 x the initial training loss"
    assert time_to_losses(time, loss, targets) == pytest.approx(
        {"0.5": 1 + 0.1 / 0.3, "0.2": 2 + 0.1 / 0.25, "0.1": 2 + 0.2 / 0.25})
    stated, reference = target_losses([0.04, 0.3], initial_loss=1.0)
    assert (stated, reference) == ([0.3, 0.04], "eval.target_losses")
    assert time_to_losses(time, loss, stated) == {"0.3": 2.0, "0.04": None}  # never reached
