"""hetsgd.outputs.paper_table: times and speedups over the GPU alone, where it got there, where it
did not, and where its run cannot say when."""

from __future__ import annotations

import math

from hetsgd.outputs import paper_table


def run(seed: int, reached: float | None, snapshots: int = 50, time_s: float = 0.5):
    return paper_table.Run(seed=seed, time_s=time_s, cpu_share=1.0, gpu_util=None, cpu_busy=100.0,
                           final_loss=0.05, times={0.1: reached}, snapshots=snapshots,
                           adaptive=None, final_batches={})


def row(algo: str, *runs):
    return paper_table.Row("paper_hogbatch_v100", algo, list(runs))


def test_speedup_is_the_mean_of_per_seed_ratios():
    gpu = row("sync", run(0, 0.4), run(1, 0.2))
    hogbatch = row("hogbatch", run(0, 0.1), run(1, 0.1))
    assert paper_table.speedup(hogbatch, gpu, 0.1) == "3.0 ± 1.4x"


def test_a_gpu_alone_that_never_got_there_gives_a_lower_bound():
    gpu = row("sync", run(0, None, time_s=0.5), run(1, 0.2))
    hogbatch = row("hogbatch", run(0, 0.01), run(1, 0.1))
    assert paper_table.speedup(hogbatch, gpu, 0.1) == "≥ 2.0x"


def test_a_run_without_snapshots_between_its_ends_has_no_time_to_a_loss_it_reached():
    blind = run(1, 0.3, snapshots=2)
    assert math.isnan(paper_table.time_to(blind, 0.1))
    assert paper_table.time_to(run(1, None, snapshots=2), 0.1) is None
    gpu = row("sync", run(0, None), blind)
    hogbatch = row("hogbatch", run(0, 0.01), run(1, 0.01))
    assert paper_table.speedup(hogbatch, gpu, 0.1) == "≥ 50x (1/2)"
    assert paper_table.mean_std([math.nan, 0.2], ".2f", 2) == "0.20 (1/2)"
