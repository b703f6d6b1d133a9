"""Figures from hand-made run directories: which files appear, and that redrawing is exact."""

from __future__ import annotations

import hashlib
import json
import shutil
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from matplotlib.figure import Figure
from test_report import write_broken_runs, write_failed, write_overrides, write_run, write_sweep

from hetsgd.errors import UserError
from hetsgd.outputs import plots, run_figures
from hetsgd.outputs.index import index_runs
from hetsgd.outputs.plots import plot_all, plot_comparison
from hetsgd.outputs.run_figures import _run_utilization, plot_run, run_title
from hetsgd.outputs.summary import Launch, Mix, RunSummary

RUN_FIGURES = {"loss_vs_time", "loss_vs_epoch", "accuracy_vs_time", "utilization",
               "update_shares"}
COMPARISON_FIGURES = {f"{name}_digits" for name in
                      ("loss_vs_time", "loss_vs_epoch", "accuracy_vs_time", "update_shares")}


def _hashes(paths: list[Path]) -> dict[Path, str]:
    return {p: hashlib.sha256(p.read_bytes()).hexdigest() for p in paths}


@pytest.fixture
def saved_figures(monkeypatch: pytest.MonkeyPatch) -> dict[Path, Figure]:
    """Every figure saved, by the path of its PNG file (or the first of its formats), with its
    line data to read back."""
    figures: dict[Path, Figure] = {}

    def keeping(save):
        def save_and_keep(fig: Figure, out_dir: Path, name: str, formats) -> list[Path]:
            paths = save(fig, out_dir, name, formats)
            figures[paths[0]] = fig
            return paths
        return save_and_keep

    monkeypatch.setattr(run_figures, "save", keeping(run_figures.save))
    monkeypatch.setattr(plots, "save", keeping(plots.save))
    return figures


def _lines(fig: Figure) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    return {line.get_label(): (np.asarray(line.get_xdata(), float),
                               np.asarray(line.get_ydata(), float))
            for line in fig.axes[0].get_lines()}


def _assert_run_curves(figures: dict[Path, Figure], run: Path, ext: str = "png") -> None:
    """A run's loss and accuracy figures draw its convergence.csv's columns against the axis
    each names."""
    conv = pd.read_csv(run / "convergence.csv")
    for name, axis in (("loss_vs_time", "time_s"), ("loss_vs_epoch", "epoch")):
        lines = _lines(figures[run / "figures" / f"{name}.{ext}"])
        for column in ("train_loss", "test_loss"):
            x, y = lines[column.replace("_", " ")]
            np.testing.assert_array_equal(x, conv[axis])
            np.testing.assert_array_equal(y, conv[column])
    (x, y), = _lines(figures[run / "figures" / f"accuracy_vs_time.{ext}"]).values()
    np.testing.assert_array_equal(x, conv["time_s"])
    np.testing.assert_array_equal(y, conv["test_acc"])
    # a bar per group, its summary's update share (not a share of 0 and 1, nor another group's)
    shares = json.loads((run / "summary.json").read_text())["update_share"]
    bars = figures[run / "figures" / f"update_shares.{ext}"].axes[0]
    assert [label.get_text() for label in bars.get_xticklabels()] == list(shares)
    assert [bar.get_height() for bar in bars.patches] == list(shares.values())
    assert len(set(shares.values())) > 1  # groups told apart


def _assert_comparison_curves(fig: Figure, jobs: list[Path]) -> None:
    """Each line of a comparison's loss-vs-time figure is the mean, over its seeds, of the
    runs' (L0 - L) / (L0 - L_best), L_best the lowest training loss of them all, on an even
    grid of the time axis (every run here ends at the same time)."""
    convs = {job: pd.read_csv(job / "convergence.csv") for job in jobs}
    l_best = min(conv["train_loss"].min() for conv in convs.values())
    lines = {label: xy for label, xy in _lines(fig).items() if "(n=" in label}  # not the targets
    by_row: dict[str, list[pd.DataFrame]] = {}
    for job, conv in convs.items():
        algo, devices = (part.split("=")[1] for part in job.name.split("_", 1)[1].split(",")[:2])
        by_row.setdefault(f"{algo} · {devices}", []).append(conv)
    assert len(lines) == len(by_row)
    for row, runs in by_row.items():
        (x, y), = (xy for label, xy in lines.items() if label.startswith(f"{row} "))
        np.testing.assert_allclose(x, np.linspace(0.0, runs[0]["time_s"].iloc[-1], len(x)))
        normalized = [(c["train_loss"].iloc[0] - c["train_loss"]) / (c["train_loss"].iloc[0] - l_best)
                      for c in runs]
        np.testing.assert_allclose(y, np.mean([np.interp(x, c["time_s"], n)
                                               for c, n in zip(runs, normalized)], axis=0))


@pytest.mark.wall
def test_plot_all_draws_every_figure_and_redraws_the_same_bytes(
        tmp_path: Path, saved_figures: dict[Path, Figure]) -> None:
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
    # what is drawn is the files' data, each curve from its own column
    completed = sorted(d for d in sweep.iterdir() if (d / "figures").is_dir())
    for job in completed:
        _assert_run_curves(saved_figures, job)
    _assert_comparison_curves(saved_figures[sweep / "figures" / "loss_vs_time_digits.png"], completed)

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


def test_svg_and_pdf_are_reproducible(tmp_path: Path, saved_figures: dict[Path, Figure]) -> None:
    run = write_run(tmp_path / "run", algo="hogbatch", devices="emulated", seed=0,
                    emulated=True)
    first = _hashes(plot_run(run, formats=("svg", "pdf")))
    assert {p.suffix for p in first} == {".svg", ".pdf"}
    _assert_run_curves(saved_figures, run, "svg")
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
    # an unreadable file costs only the figures drawn from it: the utilization one stays, as
    # the loss figures stay beside an unreadable utilization.csv
    assert by_dir[results / "corrupt" / "figures"] == {"utilization", "update_shares", "batch_sizes"}
    assert {"loss_vs_time_digits", "loss_vs_epoch_digits"} <= by_dir[results / "figures"]
    warned = " ".join(r.getMessage() for r in caplog.records if r.levelname == "WARNING")
    assert "corrupt/convergence.csv" in warned
    good = results / "good"
    (good / "utilization.csv").write_bytes(b"time_s,host\x00\xff")
    assert {p.stem for p in plot_all(good)} == RUN_FIGURES - {"utilization"}


def test_a_format_asked_twice_is_drawn_and_counted_once(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from hetsgd.cli import app

    run = write_run(tmp_path / "run", algo="sync", devices="gpu", seed=0)
    done = CliRunner().invoke(app, ["plot", str(run), "--format", "png,PNG,.png"])
    written = list((run / "figures").iterdir())
    assert done.exit_code == 0 and {p.suffix for p in written} == {".png"}
    assert f"{len(written)} figure file(s) written" in " ".join(done.stdout.split())


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
    assert summary.cores_sampled == 4
    # simulated, the accelerator is a GPU column: the workers' CPU is the host group's 3 cores
    assert replace(summary, simulated=True).cores_sampled == 3
    # under torchrun the monitor samples rank 0's process alone: worker 0's (the first group's)
    ranks = replace(summary, launch=Launch(torchrun=True, nodes=1, ranks_per_node=2))
    assert (list(summary.mix.groups)[0], ranks.cores_sampled) == ("accel", 1)
    assert replace(ranks, mix=Mix(dict(reversed(groups.items())))).cores_sampled == 3
    fig = _run_utilization(util, None, "title", summary.cores_sampled)
    lines = {line.get_label(): line for line in fig.axes[0].get_lines()}
    workers = lines["workers' CPU\n(of the 4 cores given)"]
    np.testing.assert_allclose(workers.get_ydata(), util["workers_cpu_percent"] / 4)
    host = lines["host CPU\n(all processes)"]
    assert host.get_linestyle() == "--"
    np.testing.assert_allclose(host.get_ydata(), util["host_cpu_percent"])
    assert [label for label in lines if label.startswith("GPU")] == ["GPU cuda:0"]
    np.testing.assert_allclose(lines["GPU cuda:0"].get_ydata(), util["gpu0_util"])

    summary = replace(summary, mix=None)  # one that does not say: a share of every host core
    fig = _run_utilization(util, None, "title", summary.cores_sampled)
    lines = {line.get_label(): line for line in fig.axes[0].get_lines()}
    np.testing.assert_allclose(lines["workers' CPU\n(of all 2 host cores)"].get_ydata(),
                               util["workers_cpu_percent"] / 2)


def _edit_summary(run: Path, **fields: object) -> None:
    summary = json.loads((run / "summary.json").read_text())
    (run / "summary.json").write_text(json.dumps({**summary, **fields}))


FLAGGED = {"contention": {"flagged": True, "workers_cpu_share": 0.4, "threshold": 0.7}}


def test_flagged_runs_are_drawn_and_said_to_be_flagged(
        tmp_path: Path, saved_figures: dict[Path, Figure]) -> None:
    """The report does not time runs flagged as contended; the figures still draw them (on a
    busy machine all may be), but the legend counts them and a run's own titles say so."""
    sweep = write_sweep(tmp_path / "sweep", failed=False)
    jobs = sorted(d for d in sweep.iterdir() if d.name[0].isdigit())
    for job in jobs:
        if "algo=adaptive,devices=auto" in job.name or job.name.startswith("0_"):
            _edit_summary(job, **FLAGGED)
    plot_comparison(index_runs(sweep), sweep / "figures")
    for name in ("loss_vs_time", "loss_vs_epoch", "accuracy_vs_time"):
        lines = _lines(saved_figures[sweep / "figures" / f"{name}_digits.png"])
        assert sorted(label for label in lines if "(n=" in label) == [
            "adaptive · auto (emulated)  (n=2, 2 flagged)", "adaptive · cpu+gpu  (n=2)",
            "sync · auto (emulated)  (n=2)", "sync · cpu+gpu  (n=2, 1 flagged)"]

    plot_run(jobs[0])
    title = saved_figures[jobs[0] / "figures" / "loss_vs_time.png"].axes[0].get_title()
    assert title.split("\n")[0] == "digits · mlp: sync on cpu+gpu, seed 0 [flagged as contended]"
    assert "flagged" not in run_title(RunSummary.read(jobs[1]))
    failed = write_failed(tmp_path / "failed", algo="sync", devices="gpu", seed=0, error="x")
    _edit_summary(failed, **FLAGGED)
    assert run_title(RunSummary.read(failed)).endswith("seed 0 [failed, flagged as contended]")


def _lr_sweep(sweep: Path, rates: list[str]) -> None:
    """One run of sync on one mix per learning rate: rows that differ only in their variant."""
    for i, lr in enumerate(rates):
        run = write_run(sweep / f"{i}_optim.lr={lr}", algo="sync", devices="cpu+gpu", seed=0,
                        speed=1.0 + i / 10)
        write_overrides(run, [f"optim.lr={lr}"])


def _looks(fig: Figure) -> list[tuple[object, ...]]:
    return [(line.get_color(), line.get_linestyle(), line.get_marker())
            for line in fig.axes[0].get_lines() if "(n=" in str(line.get_label())]


def test_every_row_of_a_figure_looks_different(
        tmp_path: Path, saved_figures: dict[Path, Figure]) -> None:
    """An lr sweep of one method on one mix: one colour, and four line styles for six rows;
    the rows past the fourth get markers, so that no two look alike. Four rows keep their
    plain lines."""
    rates = ["0.001", "0.003", "0.01", "0.03", "0.1", "0.3"]
    _lr_sweep(tmp_path / "six", rates)
    plot_comparison(index_runs(tmp_path / "six"), tmp_path / "six" / "figures")
    for name in ("loss_vs_time", "loss_vs_epoch", "accuracy_vs_time"):
        looks = _looks(saved_figures[tmp_path / "six" / "figures" / f"{name}_digits.png"])
        assert len(looks) == len(rates) and len(set(looks)) == len(looks), looks

    _lr_sweep(tmp_path / "four", rates[:4])
    plot_comparison(index_runs(tmp_path / "four"), tmp_path / "four" / "figures")
    looks = _looks(saved_figures[tmp_path / "four" / "figures" / "loss_vs_time_digits.png"])
    assert len(set(looks)) == 4 and {marker for _, _, marker in looks} == {"None"}


def _tick_texts(fig: Figure) -> list[str]:
    return [label.get_text() for label in fig.axes[0].get_xticklabels()]


def test_tick_labels_from_run_folders_are_escaped_in_the_saved_figure(
        tmp_path: Path, saved_figures: dict[Path, Figure]) -> None:
    """Tick labels are rebuilt from their formatter when a figure is drawn, after save() has
    escaped the figure's text: a group name or an override with ESC and BEL in it must be
    escaped where the ticks are set."""
    group = "accel\x1b]0;pwned\x07"
    sweep = tmp_path / "sweep"
    for seed, note in enumerate(("+note=\x1b[31mRED\x07", "+note=plain")):
        run = write_run(sweep / f"{seed}_run", algo="hogbatch", devices="cpu+gpu", seed=seed)
        write_overrides(run, [note])
        summary = json.loads((run / "summary.json").read_text())
        _edit_summary(run, update_share={"cpu": summary["update_share"]["cpu"],
                                         group: summary["update_share"]["accel"]},
                      updates_by_group={"cpu": summary["updates_by_group"]["cpu"],
                                        group: summary["updates_by_group"]["accel"]})
    plot_run(sweep / "0_run")
    plot_comparison(index_runs(sweep), sweep / "figures")
    run_ticks = _tick_texts(saved_figures[sweep / "0_run" / "figures" / "update_shares.png"])
    assert run_ticks == ["cpu", "accel\\x1b]0;pwned\\x07"]
    comparison_ticks = _tick_texts(saved_figures[sweep / "figures" / "update_shares_digits.png"])
    assert "+note=\\x1b[31mRED\\x07" in "\n".join(comparison_ticks), comparison_ticks
    for text in (*run_ticks, *comparison_ticks):
        assert "\x1b" not in text and "\x07" not in text
