"""The report's speedup column from hand-made run folders: a plain ratio where the baseline and
the row both reach normalized loss 0.9, a lower bound where only the row does, a dash where the
row never does.

Every curve here starts at 2.0 and the best loss of a comparison is 0.1, so a loss of 1.05 is
normalized loss 0.5; one snapshot a second, so the times to 0.9 can be worked out by hand."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
import pytest
from test_comparable_rows import edit_summary
from test_report import table_rows, write_run

from hetsgd.outputs.report import write_report

# reaches 0.9 at 1.8 s: 0.5 at 1 s, 1.0 at 2 s
FAST = [2.0, 1.05, 0.1]
# reaches 0.9 at 3.6 s: 0.75 at 3 s, 1.0 at 4 s
SLOW = [2.0, 1.525, 1.05, 0.575, 0.1]
# never gets past normalized loss 0.27
STUCK = [2.0, 1.9, 1.8, 1.7, 1.6, 1.5]


def speedups(folder: Path) -> tuple[str, dict[str, list[str]], pd.DataFrame]:
    """The report's markdown, each algorithm's speedup and verdict cells and report.csv by
    algorithm."""
    markdown = write_report(folder)
    cells = {row[0]: row[-2:] for row in table_rows(markdown)}
    return markdown, cells, pd.read_csv(folder / "report.csv").set_index("algo")


def test_a_baseline_that_never_reached_the_target_gives_a_lower_bound(tmp_path: Path) -> None:
    # the baseline ran 5, 4 and 3 s on its three seeds, reaching 0.9 on none
    for seed, ran in enumerate((5, 4, 3)):
        write_run(tmp_path / f"sync{seed}", algo="sync", devices="gpu", seed=seed,
                  train_loss=STUCK[:ran + 1])
    for seed in (0, 1, 2):
        write_run(tmp_path / f"hogbatch{seed}", algo="hogbatch", devices="cpu+gpu", seed=seed,
                  train_loss=FAST)
        write_run(tmp_path / f"hogwild{seed}", algo="hogwild", devices="cpu", seed=seed,
                  train_loss=STUCK[:3])
    markdown, cells, numbers = speedups(tmp_path)
    bound = 4 / 1.8  # the baseline's mean time run over hogbatch's t@0.9
    # the interval: log-scale standard error sqrt(var(5, 4, 3) / (3 * 4²)) (hogbatch's 1.8 s
    # never moves) on Welch's 2 degrees of freedom, t = 4.3027...; it leaves out 1: faster
    half = 4.302652729911275 * math.sqrt(1 / 48)
    assert cells["hogbatch"] == [
        f"≥ {bound:.2f} [{bound * math.exp(-half):.2f}, {bound * math.exp(half):.2f}]",
        "faster"] == ["≥ 2.22 [1.19, 4.14]", "faster"]
    assert numbers.at["hogbatch", "speedup"] == pytest.approx(bound)
    assert numbers.at["hogbatch", "speedup_bound"]
    assert cells["hogwild"] == ["—", "—"]  # the row never got there either
    assert cells["sync"] == ["baseline", "—"]  # nor did the baseline itself
    assert "never stayed at 0.9" in markdown and "(4.00 s mean" in markdown
    assert "lower bounds (≥)" in markdown


def test_where_both_reach_the_target_the_ratio_is_plain(tmp_path: Path) -> None:
    write_run(tmp_path / "sync", algo="sync", devices="gpu", seed=0, train_loss=SLOW)
    write_run(tmp_path / "hogbatch", algo="hogbatch", devices="cpu+gpu", seed=0,
              train_loss=FAST)
    write_run(tmp_path / "hogwild", algo="hogwild", devices="cpu", seed=0, train_loss=STUCK)
    markdown, cells, numbers = speedups(tmp_path)
    # one seed each: a ratio, no interval, and no ranking
    assert cells == {"sync": ["baseline", "—"], "hogbatch": [f"{3.6 / 1.8:.2f}", "n=1: no interval"],
                     "hogwild": ["—", "—"]}
    assert not numbers["speedup_bound"].any()
    assert numbers["speedup_low"].isna().all()
    assert "lower bound" not in markdown
    assert "Fastest to 0.9: hogbatch · cpu+gpu (n=1: no interval, so no row is ranked" in markdown


def test_a_row_slower_than_the_baseline_is_slower_unless_the_baseline_is_a_lower_bound(
        tmp_path: Path) -> None:
    # reaches 0.9 at 6.9 s: 0 until 6 s, 1.0 at 7 s; later than STUCK runs (5 s)
    late = [2.0] * 7 + [0.1, 0.1]
    for seed in (0, 1, 2):
        write_run(tmp_path / "plain" / f"sync{seed}", algo="sync", devices="gpu", seed=seed,
                  train_loss=FAST)
        write_run(tmp_path / "bound" / f"sync{seed}", algo="sync", devices="gpu", seed=seed,
                  train_loss=STUCK)
        for folder in ("plain", "bound"):
            write_run(tmp_path / folder / f"hogbatch{seed}", algo="hogbatch",
                      devices="cpu+gpu", seed=seed, train_loss=late)
    _, cells, _ = speedups(tmp_path / "plain")
    assert cells["hogbatch"] == [f"{1.8 / 6.9:.2f} [{1.8 / 6.9:.2f}, {1.8 / 6.9:.2f}]", "slower"]
    # the baseline never got there: its 5 s are a lower bound on its time, so a row that took
    # longer may still be faster; the interval lies below 1, and the verdict cannot say slower
    _, cells, _ = speedups(tmp_path / "bound")
    assert cells["hogbatch"] == [f"≥ {5 / 6.9:.2f} [{5 / 6.9:.2f}, {5 / 6.9:.2f}]",
                                 "not distinguishable"]


def test_the_default_baseline_is_sync_on_the_mix_named_gpu_as_in_the_papers(
        tmp_path: Path) -> None:
    # sync on the host, listed first, is the slower one: over it the GPU would be 2x faster
    write_run(tmp_path / "a_sync_cpu", algo="sync", devices="cpu", seed=0, train_loss=SLOW)
    write_run(tmp_path / "b_sync_gpu", algo="sync", devices="gpu", seed=0, train_loss=FAST)
    markdown = write_report(tmp_path)
    numbers = pd.read_csv(tmp_path / "report.csv").set_index("devices")
    assert numbers.at["gpu", "baseline"] and not numbers.at["cpu", "baseline"]
    assert numbers.at["cpu", "speedup"] == pytest.approx(1.8 / 3.6)
    assert "baseline: sync · gpu (default" in markdown


def test_a_sync_row_whose_runs_were_all_flagged_is_named_not_called_missing(
        tmp_path: Path) -> None:
    """It is there, untimed: the sentence that said the comparison had no sync run sent the
    reader looking for one."""
    for seed in (0, 1):
        run_dir = write_run(tmp_path / f"sync{seed}", algo="sync", devices="gpu", seed=seed,
                            train_loss=SLOW)
        edit_summary(run_dir, contention={"flagged": True, "workers_cpu_share": 0.4})
        write_run(tmp_path / f"hogbatch{seed}", algo="hogbatch", devices="cpu+gpu", seed=seed,
                  train_loss=FAST)
    markdown, cells, _ = speedups(tmp_path)
    assert ("Baseline sync · gpu (default: the comparison's sync run) has no timed run (2 flagged "
            "as contended: --keep-flagged times them): no speedups.") in markdown
    assert "No baseline" not in markdown and cells["hogbatch"] == ["—", "—"]
    kept = write_report(tmp_path, keep_flagged=True)
    assert "faster" in kept and "no timed run" not in kept
