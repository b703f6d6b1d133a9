"""hetsgd.outputs.paper_table: times and speedups over the GPU alone, where it got there, where it
did not, and where its run cannot say when."""

from __future__ import annotations

import math

from hetsgd.outputs import paper_table
from hetsgd.outputs.cells import mean_cell


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
