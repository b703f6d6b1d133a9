"""The report's split of each worker's time (hetsgd/outputs/time_split.py)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from hetsgd.outputs.time_split import split_markdown, worker_split

KEYS = ("algo", "devices", "variant")


def _run(root: Path, name: str, seconds: tuple[float, float, float, float], status: str = "completed",
         split: bool = True, algo: str = "hogbatch", batches: tuple[int, int] = (256, 256)) -> dict:
    """A run of one worker of 100 updates, its batch size ``batches`` first and last."""
    run_dir = root / name
    run_dir.mkdir()
    compute, copy, merge, wait = seconds
    row = {"worker": 0, "group": "accel", "device": "cpu", "label": "emulated", "threads": 1,
           "first_batch": batches[0], "last_batch": batches[1], "updates": 100,
           "busy_s": compute, "wait_s": wait, "comm_s": copy + merge}
    if split:
        row.update(compute_s=compute, copy_s=copy, merge_s=merge)
    pd.DataFrame([row]).to_csv(run_dir / "workers.csv", index=False)
    return {"algo": algo, "devices": "emulated", "variant": "", "status": status,
            "run_dir": str(run_dir)}


def test_each_worker_s_split_is_averaged_over_the_completed_runs(tmp_path: Path) -> None:
    runs = pd.DataFrame([_run(tmp_path, "a", (0.6, 0.1, 0.2, 0.1)),
                         _run(tmp_path, "b", (0.8, 0.1, 0.0, 1.1)),
                         _run(tmp_path, "c", (9.0, 9.0, 9.0, 9.0), status="failed"),
                         _run(tmp_path, "d", (9.0, 9.0, 9.0, 9.0), split=False)])
    split = worker_split(runs, KEYS)
    assert len(split) == 1
    row = split.iloc[0]
    assert row["compute_ms"] == pytest.approx(7.0)  # (6 + 8) / 2 ms per update
    assert row["merge_ms"] == pytest.approx(1.0)
    # each run's shares, then their mean (pooled seconds would give 40 / 6.7 / 6.7 / 46.7 %)
    assert row["copy_pct"] == pytest.approx(7.5)  # (10 % + 5 %) / 2
    assert row["merge_pct"] == pytest.approx(10.0)  # (20 % + 0 %) / 2
    assert (row["compute_pct"], row["wait_pct"]) == pytest.approx((50.0, 32.5))
    assert (row["compute_low"], row["compute_high"], row["runs"], row["batch"]) == \
        pytest.approx((6.0, 8.0, 2, 256))
    text = split_markdown(runs, KEYS)
    assert ("| hogbatch | emulated |  | 0 accel (emulated) | 7.000 (50%) | 1.000 (8%) | "
            "1.000 (10%) | 6.000 (33%) | 6.000-8.000 |") in text
    assert "different speeds" not in text  # 8 / 6 = 1.33x: steady


def test_a_worker_whose_same_work_ran_at_different_speeds_is_named(tmp_path: Path) -> None:
    runs = pd.DataFrame([
        *(_run(tmp_path, f"hogwild{i}", (t, 0.0, 0.0, 0.0), algo="hogwild")
          for i, t in enumerate((0.40, 0.41, 0.80))),
        # the same spread where the batch size changed within a run, or between runs: its
        # updates were different work
        *(_run(tmp_path, f"adaptive{i}", (t, 0.0, 0.0, 0.0), algo="adaptive",
               batches=(16, 16 * (i + 1))) for i, t in enumerate((0.4, 0.8))),
        *(_run(tmp_path, f"sync{i}", (t, 0.0, 0.0, 0.0), algo="sync", batches=(b, b))
          for i, (t, b) in enumerate(((0.4, 16), (0.8, 32)))),
        _run(tmp_path, "local_sgd0", (0.4, 0.0, 0.0, 0.0), algo="local_sgd")])
    text = split_markdown(runs, KEYS)
    assert text.endswith(
        "The same work ran at different speeds: at one batch size, an update took more than 1.5x "
        "longer in one run than in another for hogwild · emulated worker 0 accel (emulated): "
        "4.00-8.00 ms (2.0x). Something other than the method changed between these runs (how "
        "fast the machine's cores ran), so their times vary for it as well as for the method.")
    assert "| local_sgd | emulated |  | 0 accel (emulated) | 4.000 (100%) | 0.000 (0%) | " \
           "0.000 (0%) | 0.000 (0%) | — |" in text  # one run: no range


def test_runs_without_the_split_add_no_section(tmp_path: Path) -> None:
    runs = pd.DataFrame([_run(tmp_path, "old", (1.0, 0.0, 0.0, 0.0), split=False)])
    assert split_markdown(runs, KEYS) == ""


def test_what_a_run_folder_holds_is_data_a_bad_value_costs_its_own_worker_or_run(
        tmp_path: Path) -> None:
    runs = [_run(tmp_path, f"hogwild{i}", (t, 0.0, 0.0, 0.0), algo="hogwild")
            for i, t in enumerate((0.40, 0.41))]
    odd = _run(tmp_path, "hogwild_odd", (0.9, 0.0, 0.0, 0.0), algo="hogwild")
    workers = pd.read_csv(Path(odd["run_dir"]) / "workers.csv")
    bad = workers.assign(worker=1, compute_s="fast")
    pd.concat([workers.assign(first_batch="x"), bad]).to_csv(
        Path(odd["run_dir"]) / "workers.csv", index=False)
    unreadable = _run(tmp_path, "hogwild_text", (9.0, 0.0, 0.0, 0.0), algo="hogwild")
    (Path(unreadable["run_dir"]) / "workers.csv").write_text("worker,group\nzero,accel\n")
    changes = _run(tmp_path, "hogwild_changes", (9.0, 0.0, 0.0, 0.0), algo="hogwild")
    (Path(changes["run_dir"]) / "batches.csv").write_text("time_s,worker,batch_size\nx,y,z\n")
    every = pd.DataFrame([*runs, odd, unreadable, changes])
    split = worker_split(every, KEYS).set_index("worker")
    # worker 1 had text for a number: left out; an unreadable workers.csv or batches.csv: its
    # run left out; worker 0 of the odd run counts, but with a batch size that is not a number
    # it is not judged
    assert list(split.index) == ["0"] and split.at["0", "runs"] == 3
    assert split.at["0", "compute_high"] == pytest.approx(9.0) and pd.isna(split.at["0", "batch"])
    assert "different speeds" not in split_markdown(every, KEYS)


def test_a_named_worker_reads_as_its_row_does_in_the_rest_of_the_report(tmp_path: Path) -> None:
    runs = [_run(tmp_path, f"hogwild{i}", (t, 0.0, 0.0, 0.0), algo="hogwild")
            for i, t in enumerate((0.4, 0.8))]
    for run in runs:  # the accelerator's role on a CPU core: the mix is marked emulated
        run.update(devices="auto", emulated=True)
    runs.append(_run(tmp_path, "hogwild2", (0.4, 0.0, 0.0, 0.0), algo="hogwild"))
    runs[-1].update(devices="auto", emulated=True)
    workers = Path(runs[-1]["run_dir"]) / "workers.csv"  # a worker labelled with an escape
    pd.read_csv(workers).assign(label="cpu\x1b[2J").to_csv(workers, index=False)
    text = split_markdown(pd.DataFrame(runs), KEYS)
    assert "hogwild · auto (emulated) worker 0 accel (emulated): 4.00-8.00 ms (2.0x)" in text
    assert "0 accel (cpu\\x1b[2J)" in text and "\x1b" not in text  # escaped, in its own row


def test_a_worker_whose_batch_size_left_and_came_back_is_not_judged(tmp_path: Path) -> None:
    runs = [_run(tmp_path, f"adaptive{i}", (t, 0.0, 0.0, 0.0), algo="adaptive", batches=(16, 16))
            for i, t in enumerate((0.4, 0.8))]
    pd.DataFrame({"time_s": [0.0, 1.0, 2.0], "worker": [0, 0, 0],
                  "batch_size": [16, 32, 16]}).to_csv(Path(runs[1]["run_dir"]) / "batches.csv",
                                                      index=False)
    assert "different speeds" not in split_markdown(pd.DataFrame(runs), KEYS)
    # the same runs where only another worker changed its size: worker 0 kept one, and is named
    pd.DataFrame({"time_s": [0.0, 0.0, 1.0], "worker": [0, 1, 1],
                  "batch_size": [16, 64, 128]}).to_csv(Path(runs[1]["run_dir"]) / "batches.csv",
                                                       index=False)
    assert "adaptive · emulated worker 0 accel (emulated): 4.00-8.00 ms (2.0x)" in \
        split_markdown(pd.DataFrame(runs), KEYS)


@pytest.mark.parametrize(("seconds", "named"), [((0.40, 0.58), False), ((0.40, 0.62), True),
                                                ((0.40, 0.60), False), ((0.0, 0.62), False)])
def test_the_bound_is_one_and_a_half_times_the_fastest_update(
        tmp_path: Path, seconds: tuple[float, float], named: bool) -> None:
    runs = [_run(tmp_path, f"hogwild{i}", (t, 0.0, 0.0, 0.0), algo="hogwild")
            for i, t in enumerate(seconds)]  # 1.45x, 1.55x, 1.5x (not more); 0 ms says nothing
    assert ("different speeds" in split_markdown(pd.DataFrame(runs), KEYS)) is named


def test_a_worker_that_landed_no_update_in_a_run_is_left_out_of_that_run(tmp_path: Path) -> None:
    """Read as 0 ms and 0 % in every part, it halved the worker's mean and set its compute
    range's low end to 0, which hid an unsteady speed."""
    runs = pd.DataFrame([_run(tmp_path, "a", (1.0, 0.5, 0.5, 0.0)),
                         _run(tmp_path, "b", (0.0, 0.0, 0.0, 0.0))])
    workers = pd.read_csv(tmp_path / "b" / "workers.csv").assign(updates=0)
    workers.to_csv(tmp_path / "b" / "workers.csv", index=False)
    row = worker_split(runs, KEYS).iloc[0]
    assert (row["compute_ms"], row["copy_ms"], row["compute_pct"], row["runs"]) == \
        pytest.approx((10.0, 5.0, 50.0, 1))
    assert row["compute_low"] == pytest.approx(10.0)


def test_a_completed_run_without_worker_rows_is_named_not_dropped_in_silence(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Every completed run writes a row per worker: a header alone (or no file) is a damaged
    run, which the split leaves out saying so, as it does an unreadable file."""
    kept = _run(tmp_path, "kept", (1.0, 0.0, 0.0, 0.0))
    header = _run(tmp_path, "header", (9.0, 0.0, 0.0, 0.0))
    path = Path(header["run_dir"]) / "workers.csv"
    path.write_text(path.read_text().splitlines()[0] + "\n")
    gone = _run(tmp_path, "gone", (9.0, 0.0, 0.0, 0.0))
    (Path(gone["run_dir"]) / "workers.csv").unlink()
    split = worker_split(pd.DataFrame([kept, header, gone]), KEYS)
    assert split["runs"].tolist() == [1]
    named = [r.getMessage() for r in caplog.records if "left out of the time split" in r.getMessage()]
    assert named == [f"left out of the time split: {tmp_path / name}/workers.csv is missing or has "
                     "no rows" for name in ("header", "gone")]
