"""Random and hostile input to `hetsgd run`, in process: whatever the overrides and the bytes of the
data file, the command ends with one clean error line and a non-zero exit, or with a completed
run; never a traceback, a hang, or a file outside the results folder."""

from __future__ import annotations

import faulthandler
import gzip
import json
import lzma
import os
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from hetsgd.cli import app

pytestmark = pytest.mark.integration  # each example may spawn worker processes

HOSTILE_TEXT = st.sampled_from([
    "", " ", "/", "..", "../..", "../../outside", "a/b", "/tmp", "ü", "名前", "\u202e", "'", '"',
    "\\", "${oc.env:HOME}", "${hetsgd.cores:}", "nan", "inf", "-inf", "null", "[]", "{}", "1e309",
    "-1", "0", "a,b"])
NUMBERS = st.one_of(st.integers(-(10**30), 10**30), st.floats()).map(str)
VALUES = st.one_of(HOSTILE_TEXT, NUMBERS, st.text(max_size=12))
# Keys that keep a run short and small whatever their value: not the budget (the test sets it
# last), nor worker counts, threads, batch sizes, slowdowns or layer widths (no upper bound yet),
# nor a remote dataset (it would download).
KEYS = ["seed", "optim.lr", "optim.momentum", "optim.weight_decay", "optim.lr_scaling",
        "optim.milestones", "data.shuffle", "data.augment", "dataset.task", "dataset.scale",
        "dataset.test_fraction", "dataset.limit", "eval.target_losses", "eval.train_subset",
        "model.activation", "devices.only", "monitor.interval_s"]
GROUPS = {"algo": ["sync", "hogwild", "hogbatch"], "model": ["mlp", "logreg"],
          "devices": ["single_cpu", "emulated"]}
KEY_OVERRIDES = st.builds("{}={}".format, st.sampled_from(KEYS), VALUES)
GROUP_OVERRIDES = st.sampled_from(sorted(GROUPS)).flatmap(
    lambda group: st.builds(f"{group}={{}}".format, st.one_of(st.sampled_from(GROUPS[group]),
                                                              HOSTILE_TEXT)))
OVERRIDES = st.lists(st.one_of(KEY_OVERRIDES, GROUP_OVERRIDES), max_size=3)

LIBSVM_LINES = st.lists(st.builds(
    "{} {}".format, st.sampled_from(["1", "-1", "0", "+1", "2", "x"]),
    st.lists(st.builds("{}:{}".format, st.integers(-1, 20), st.floats(-5, 5, width=32)),
             max_size=4).map(" ".join)), min_size=0, max_size=60).map("\n".join)
COMPRESS = {"": lambda data: data, ".svm": lambda data: data, ".gz": gzip.compress,
            ".xz": lzma.compress}
# (suffix, whether the bytes are compressed as the suffix says, bytes)
DATA_FILES = st.tuples(st.sampled_from(sorted(COMPRESS)), st.booleans(),
                       st.one_of(st.binary(max_size=400), LIBSVM_LINES.map(str.encode)))
TAIL = ["budget.seconds=0.5", "budget.epochs=null", "eval.every_s=0.25", "progress=false"]
HANG_S = 180  # far beyond a 0.5 s run; a run still going then is a hang
# How a run may end, by the exit code: a huge learning rate may well diverge.
STATUS_OF_EXIT = {0: "completed", 1: "failed", 3: "diverged"}


def _files(root: Path) -> set[Path]:
    return {p.relative_to(root) for p in root.rglob("*") if p.is_file()}


def _invoke(root: Path, args: list[str]) -> tuple[int, str, str]:
    """`hetsgd run ARGS` in process, from `root/work`, results in `root/out` (not the working
    folder's `results`, where a run that ignored $HETSGD_RESULTS would write)."""
    # HETSGD_CORES: two workers for hogwild's mix of one per core, on any machine
    env = {"HETSGD_RESULTS": str(root / "out"), "HETSGD_DATA": str(root / "cache"),
           "HETSGD_CORES": "2"}
    (root / "work").mkdir()
    cwd = os.getcwd()
    faulthandler.dump_traceback_later(HANG_S, exit=True)
    try:
        os.chdir(root / "work")
        result = CliRunner().invoke(app, ["run", *args], env=env)
    finally:
        faulthandler.cancel_dump_traceback_later()
        os.chdir(cwd)
    assert result.exception is None or isinstance(result.exception, SystemExit), \
        f"{args}: {result.exception!r}"
    return result.exit_code, result.stdout, result.stderr


@settings(max_examples=30, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(overrides=OVERRIDES, data_file=st.one_of(st.none(), DATA_FILES))
def test_any_input_ends_in_a_clean_error_or_a_completed_run(
        overrides: list[str], data_file: tuple[str, bool, bytes] | None) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        args = list(overrides)
        if data_file is not None:
            suffix, compressed, content = data_file
            path = root / f"data{suffix}"
            path.write_bytes(COMPRESS[suffix](content) if compressed else content)
            args += ["dataset=libsvm", f"dataset.path={path}"]
        before = _files(root)
        code, stdout, stderr = _invoke(root, args + TAIL)

        assert "Traceback" not in stdout + stderr, args
        assert code in STATUS_OF_EXIT, (args, code, stderr)
        errors = [line for line in stderr.splitlines() if line.startswith("hetsgd: error:")]
        assert len(errors) == (code == 1), (args, stderr)
        assert all(line.removeprefix("hetsgd: error:").strip() for line in errors), (args, stderr)
        written = _files(root) - before
        assert all(p.parts[0] in ("out", "cache") for p in written), (args, written)
        summaries = list((root / "out").rglob("summary.json"))
        assert len(summaries) == 1 or (code == 1 and not summaries), (args, summaries)
        for summary in summaries:
            assert json.loads(summary.read_text())["status"] == STATUS_OF_EXIT[code], args
