"""`hetsgd recover` of a crashed run whose folder a SIGKILL, a copy or a user left damaged: the
summary agrees with the curve, names the folder it was written in, and every refusal is one line
that says the true reason."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner, Result

from hetsgd.atomic import writing_path
from hetsgd.cli import app
from hetsgd.config.compose import rebuild_config
from hetsgd.errors import UserError
from hetsgd.outputs.index import CRASHED, read_summary
from hetsgd.outputs.journal import read_snapshots
from hetsgd.outputs.run_directory import SNAPSHOTS, SUMMARY, RunDirectory
from hetsgd.outputs.summary import by_group
from hetsgd.runs.recover import recover
from tests.conftest import abandoned_write, as_crashed


def _hetsgd(*args: str) -> Result:
    """The `hetsgd` command, in this process."""
    return CliRunner().invoke(app, list(args))


def _contents(folder: Path) -> dict[str, str]:
    """Every file under ``folder`` by the hash of its bytes: a refusal changes none."""
    return {str(path.relative_to(folder)): hashlib.sha256(path.read_bytes()).hexdigest()
            for path in sorted(folder.rglob("*")) if path.is_file()}


def _refusal(run_dir: Path) -> str:
    """`hetsgd recover RUN_DIR`, which must refuse in one line, leaving the folder as it was;
    that line."""
    before = _contents(run_dir)
    result = _hetsgd("recover", str(run_dir))
    assert result.exit_code == 1, result.output
    line, = result.stderr.splitlines()  # one line, no traceback
    assert _contents(run_dir) == before
    return line


@pytest.mark.integration
def test_the_recovered_counts_are_those_of_the_last_snapshot(run_dir: Path) -> None:
    """A coordinator killed between a snapshot and the next rewrite of workers.csv left it one
    snapshot behind: the summary took its time from the snapshot and its counts from
    workers.csv, so it disagreed with the curve's last row. The killed write's leftover goes;
    a live process's write is left alone."""
    as_crashed(run_dir)
    last = read_snapshots(run_dir)[-1]
    behind = pd.read_csv(run_dir / "workers.csv")
    behind["updates"] -= 50
    behind["examples"] -= 400
    behind.to_csv(run_dir / "workers.csv", index=False)
    leftover, live = abandoned_write(run_dir / "workers.csv"), writing_path(run_dir / "workers.csv")
    leftover.write_text("worker,gro")
    live.write_text("worker,gro")
    version = abandoned_write(run_dir / "checkpoint" / "000000000001")  # a checkpoint half written
    version.mkdir()
    (version / "state.pt").write_bytes(b"\x80")

    summary = recover(run_dir)
    curve = pd.read_csv(run_dir / "convergence.csv").iloc[-1]
    updates = {group: int(n) for group, n in by_group(behind["group"].tolist(), last.updates).items()}
    assert (summary["time_s"], summary["examples"], summary["updates"]) == (
        curve["time_s"], int(last.examples), int(curve["updates"]))
    assert summary["updates"] == sum(last.updates) and summary["updates_by_group"] == updates
    assert summary["epochs"] == pytest.approx(curve["epoch"])
    assert summary["update_share"] == {group: n / sum(updates.values())
                                       for group, n in updates.items()}
    assert summary["examples_per_s"] == pytest.approx(last.examples / last.time_s)
    assert read_summary(run_dir)["updates"] == summary["updates"]
    assert not leftover.exists() and live.exists() and not version.exists()


@pytest.mark.integration
def test_a_moved_run_is_recovered_as_the_folder_it_is_now(run_dir: Path, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """The table said `results` of the folder the run was first written in, and summary.json
    the relative path given; both name the folder recovered, absolute, as `hetsgd run` does."""
    old = read_summary(run_dir)["run_dir"]
    assert old != str(run_dir)  # the fixture is a copy of the run
    moved = tmp_path / "moved" / "the run"
    moved.parent.mkdir()
    run_dir.rename(moved)
    as_crashed(moved)
    monkeypatch.chdir(moved.parent)

    result = _hetsgd("recover", moved.name)
    assert result.exit_code == 0, result.output
    assert read_summary(moved)["run_dir"] == str(moved)
    table = re.sub(r"[\s│]", "", result.stdout)  # the path folded over the table's lines
    assert "".join(str(moved).split()) in table and "".join(old.split()) not in table


@pytest.mark.integration
def test_an_empty_config_is_a_one_line_refusal(run_dir: Path) -> None:
    as_crashed(run_dir)
    (run_dir / "config.yaml").write_text("")
    assert _refusal(run_dir) == (f"hetsgd: error: cannot rebuild the config of {run_dir}: "
                                 "config.yaml is empty")


@pytest.mark.parametrize("text", ["", "# nothing\n", "{}\n"])
def test_rebuilding_an_empty_config_names_the_file(tmp_path: Path, text: str) -> None:
    """An emptied config.yaml merged into no config (an AssertionError), and ``{}`` into
    today's defaults, which are not the run's."""
    (tmp_path / "config.yaml").write_text(text)
    with pytest.raises(UserError, match=r"^cannot rebuild: config\.yaml is empty$"):
        rebuild_config(tmp_path / "config.yaml", [], "cannot rebuild")


@pytest.mark.integration
@pytest.mark.parametrize("damage", ["missing", "garbled", "header only", "no updates"])
def test_recover_takes_the_groups_from_the_mix_without_workers_csv(run_dir: Path,
                                                                   damage: str) -> None:
    """The snapshots carry each worker's updates: a missing or garbled workers.csv said the run
    "left no snapshot to recover" (or refused it) though it left eleven."""
    as_crashed(run_dir)
    file = run_dir / "workers.csv"
    groups = pd.read_csv(file)["group"].tolist()
    if damage == "missing":
        file.unlink()
    elif damage == "garbled":
        file.write_bytes(b'worker,group\n0,"cpu\x00\n')
    elif damage == "header only":
        file.write_text(file.read_text().splitlines()[0] + "\n")
    else:
        pd.read_csv(file).drop(columns="updates").to_csv(file, index=False)
    snapshots = read_snapshots(run_dir)

    summary = recover(run_dir)
    assert summary["status"] == CRASHED
    assert len(pd.read_csv(run_dir / "convergence.csv")) == len(snapshots)
    assert summary["updates_by_group"] == {group: int(n) for group, n in
                                           by_group(groups, snapshots[-1].updates).items()}
    assert str(file) in summary["error"] and "mix" in summary["error"]


@pytest.mark.integration
def test_recover_without_workers_csv_or_mix_names_both(run_dir: Path) -> None:
    as_crashed(run_dir)
    (run_dir / "workers.csv").unlink()
    summary = json.loads((run_dir / SUMMARY).read_text())
    RunDirectory(run_dir).write_summary({**summary, "mix": None})
    assert _refusal(run_dir) == (
        f"hetsgd: error: cannot recover {run_dir}: {run_dir / 'workers.csv'} is missing, and its "
        f"{SUMMARY} names no mix of the 2 worker(s) its snapshots count, to say each one's group")


@pytest.mark.integration
def test_an_unreadable_summary_is_named_and_the_way_to_recover_said(run_dir: Path) -> None:
    """An empty summary.json read as a failed run, which the folder never said it was."""
    as_crashed(run_dir)
    (run_dir / SUMMARY).write_text("")
    kept = len(list((run_dir / SNAPSHOTS).glob("*.pt")))
    line = _refusal(run_dir)
    assert line.startswith(f"hetsgd: error: cannot recover {run_dir}: its {SUMMARY} is unreadable (")
    assert line.endswith(f"), so nothing says that the run crashed; move it aside to recover the "
                         f"{kept} snapshot file(s) left, as those of a run that wrote no summary")
    assert "status: failed" not in line

    (run_dir / SUMMARY).rename(run_dir / "summary.json.damaged")  # as the line says
    assert recover(run_dir)["status"] == CRASHED
    assert len(pd.read_csv(run_dir / "convergence.csv")) == kept
