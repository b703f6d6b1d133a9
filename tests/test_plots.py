"""Figures from hand-made run directories: which files appear, and that redrawing is exact."""

from __future__ import annotations

import hashlib
import shutil
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from test_report import write_broken_runs, write_failed, write_run, write_sweep

from hetsgd.errors import UserError
from hetsgd.outputs.index import index_runs
from hetsgd.outputs.plots import plot_all, plot_comparison
from hetsgd.outputs.run_figures import _cores_given, _run_utilization, plot_run, run_title
from hetsgd.outputs.summary import Mix, RunSummary

RUN_FIGURES = {"loss_vs_time", "loss_vs_epoch", "accuracy_vs_time", "utilization",
               "update_shares"}
COMPARISON_FIGURES = {f"{name}_digits" for name in
                      ("loss_vs_time", "loss_vs_epoch", "accuracy_vs_time", "update_shares")}


def _hashes(paths: list[Path]) -> dict[Path, str]:
    return {p: hashlib.sha256(p.read_bytes()).hexdigest() for p in paths}


@pytest.mark.slow
def test_plot_all_draws_every_figure_and_redraws_the_same_bytes(tmp_path: Path) -> None:
    results = tmp_path / "results"
    sweep = write_sweep(results / "sweeps" / "s1")
    paths = plot_all(results)
    assert len(paths) == len(set(paths)) and all(p.suffix == ".png" for p in paths)
    by_dir: dict[Path, set[str]] = {}
    for p in paths:
        by_dir.setdefault(p.parent, set()).add(p.stem)
    for job in sorted(d for d in sweep.iterdir() if d.name[0].isdigit()):
        drawn = by_dir.get(job / "figures", set())
        if "hogbatch" in job.name:  # the failed job: no files to draw from
            assert drawn == set() and not (job / "figures").exists()
        elif "adaptive" in job.name:
            assert drawn == RUN_FIGURES | {"batch_sizes"}
        else:
            assert drawn == RUN_FIGURES
    assert by_dir[sweep / "figures"] == COMPARISON_FIGURES  # the sweep's comparison
    assert by_dir[results / "figures"] == COMPARISON_FIGURES  # everything under results/

    # a redraw gives the same bytes: a run of each kind and the sweep's comparison, drawn
    # again from nothing (every figure of a kind comes from the same code)
    before = _hashes(paths)
    for figures in results.rglob("figures"):
        shutil.rmtree(figures)
    assert not any(p.exists() for p in paths)
    sync, adaptive = (next(d for d in sorted(sweep.iterdir()) if f"algo={algo}" in d.name)
                      for algo in ("sync", "adaptive"))
    redrawn = [*plot_all(sync), *plot_all(adaptive),
               *plot_comparison(index_runs(sweep), sweep / "figures")]
    assert len(redrawn) == 2 * len(RUN_FIGURES) + 1 + len(COMPARISON_FIGURES)
    assert _hashes(redrawn) == {p: before[p] for p in redrawn}


def test_svg_and_pdf_are_reproducible(tmp_path: Path) -> None:
    run = write_run(tmp_path / "run", algo="hogbatch", devices="emulated", seed=0,
                    emulated=True)
    first = _hashes(plot_run(run, formats=("svg", "pdf")))
    assert {p.suffix for p in first} == {".svg", ".pdf"}
    shutil.rmtree(run / "figures")
    assert _hashes(plot_run(run, formats=("SVG", "pdf"))) == first


def test_titles_name_dataset_and_mark_emulated_mixes(tmp_path: Path) -> None:
    run = write_run(tmp_path / "run", algo="sync", devices="auto", seed=3, emulated=True)
    assert run_title(RunSummary.read(run)) == "digits · mlp: sync on auto (emulated), seed 3"
    real = write_run(tmp_path / "real", algo="sync", devices="gpu", seed=0)
    assert "(emulated)" not in run_title(RunSummary.read(real))
    failed = write_failed(tmp_path / "failed", algo="sync", devices="gpu", seed=0, error="x")
    assert run_title(RunSummary.read(failed)).endswith("seed 0 [failed]")


def test_one_bad_run_does_not_stop_the_figures_of_the_others(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    results = write_broken_runs(tmp_path / "results")
    paths = plot_all(results)
    by_dir: dict[Path, set[str]] = {}
    for p in paths:
        by_dir.setdefault(p.parent, set()).add(p.stem)
    assert by_dir[results / "good" / "figures"] == RUN_FIGURES
    assert not (results / "corrupt" / "figures").exists()
    assert {"loss_vs_time_digits", "loss_vs_epoch_digits"} <= by_dir[results / "figures"]
    warned = " ".join(r.getMessage() for r in caplog.records if r.levelname == "WARNING")
    assert "corrupt/convergence.csv" in warned


def test_failed_run_and_bad_format(tmp_path: Path) -> None:
    failed = write_failed(tmp_path / "failed", algo="sync", devices="gpu", seed=0,
                          error="boom")
    assert plot_run(failed) == []
    with pytest.raises(UserError, match="unknown figure format 'jpg'"):
        plot_run(failed, formats=("jpg",))
    with pytest.raises(UserError, match="not a directory"):
        plot_all(tmp_path / "missing")


def test_utilization_figure_shows_the_runs_own_cpu_apart_from_the_hosts(tmp_path: Path) -> None:
    run = write_run(tmp_path / "run", algo="sync", devices="cpu+gpu", seed=0)
    util = pd.read_csv(run / "utilization.csv")
    summary = RunSummary.read(run)
    assert summary.mix is not None
    groups = {**summary.mix.groups, "cpu": replace(summary.mix.groups["cpu"], threads=3)}
    summary = replace(summary, mix=Mix(groups))  # 1 + 3 cores given, the host has 2 (cpu0, cpu1)
    assert _cores_given(summary) == 4
    fig = _run_utilization(util, None, "title", _cores_given(summary))
    lines = {line.get_label(): line for line in fig.axes[0].get_lines()}
    workers = lines["workers' CPU\n(of the 4 cores given)"]
    np.testing.assert_allclose(workers.get_ydata(), util["workers_cpu_percent"] / 4)
    host = lines["host CPU\n(all processes)"]
    assert host.get_linestyle() == "--"
    np.testing.assert_allclose(host.get_ydata(), util["host_cpu_percent"])
    assert [label for label in lines if label.startswith("GPU")] == ["GPU cuda:0"]
    np.testing.assert_allclose(lines["GPU cuda:0"].get_ydata(), util["gpu0_util"])

    summary = replace(summary, mix=None)  # one that does not say: a share of every host core
    fig = _run_utilization(util, None, "title", _cores_given(summary))
    lines = {line.get_label(): line for line in fig.axes[0].get_lines()}
    np.testing.assert_allclose(lines["workers' CPU\n(of all 2 host cores)"].get_ydata(),
                               util["workers_cpu_percent"] / 2)
