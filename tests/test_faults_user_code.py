"""The user's own code and the process's limits: a model factory that exits, raises Ctrl-C's
exception or never returns fails its run `failed` with the target named (in the coordinator and
in a worker), and a sweep goes on; `hetsgd.run` works from a thread; running out of address
space is one reason, `out of memory (...)`, in the summary and on stderr."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from processes import as_a_terminal_starts_it

import hetsgd
from hetsgd.config.problem import CustomModelConfig
from hetsgd.errors import UserError, out_of_memory
from hetsgd.model.problem import Problem

FAST = ("budget.epochs=null", "budget.seconds=1", "progress=false")
NETS = '''
import multiprocessing
import time

from torch import nn


def good(in_features, num_outputs):
    return nn.Linear(in_features, num_outputs)


def two_classes(in_features, num_classes):  # a binary task's, as torchvision and timm write it
    if num_classes != 2:
        raise ValueError(f"num_classes={num_classes}, where a binary task has 2")
    return nn.Linear(in_features, num_classes)


def one_logit(in_features):
    return nn.Linear(in_features, 1)


def exits(in_features, num_outputs):
    raise SystemExit(0)


def interrupts(in_features, num_outputs):
    raise KeyboardInterrupt


def hangs(in_features, num_outputs):
    time.sleep(3600)


def hangs_in_a_worker(in_features, num_outputs):
    if multiprocessing.parent_process() is not None:
        time.sleep(3600)
    return nn.Linear(in_features, num_outputs)
'''


@pytest.fixture
def user_code(tmp_path: Path) -> Path:
    """A folder holding the module ``badnets``, for PYTHONPATH."""
    root = tmp_path / "user_code"
    root.mkdir()
    (root / "badnets.py").write_text(textwrap.dedent(NETS))
    return root


def _hetsgd(results: Path, pythonpath: Path | None, *args: str,
            limit_bytes: int | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "HETSGD_RESULTS": str(results)}
    if pythonpath is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(pythonpath),
                                                           os.environ.get("PYTHONPATH")]))

    def limited() -> None:  # `ulimit -v`, in the child only
        if limit_bytes is not None:
            resource.setrlimit(resource.RLIMIT_AS, (limit_bytes, resource.RLIM_INFINITY))

    return subprocess.run([sys.executable, "-m", "hetsgd", *args], env=env, text=True,
                          capture_output=True, timeout=300, preexec_fn=limited)


def _summaries(folder: Path) -> dict[str, dict]:
    """Each run directory's summary under ``folder``, by the directory's name."""
    return {path.parent.name: json.loads(path.read_text())
            for path in sorted(folder.rglob("summary.json"))}


@pytest.mark.integration
def test_a_factory_that_exits_or_interrupts_fails_its_job_and_the_sweep_goes_on(
        user_code: Path, results_dir: Path) -> None:
    proc = _hetsgd(results_dir, user_code, "run", "-m", "model=custom",
                   "model._target_=badnets.exits,badnets.interrupts,badnets.good",
                   "devices=single_cpu", *FAST)
    assert proc.returncode == 1, proc.stderr
    by_target = {name.rsplit(".", 1)[-1]: summary  # job folders: 0_model._target_=badnets.exits
                 for name, summary in _summaries(results_dir / "sweeps").items()}
    assert sorted(by_target) == ["exits", "good", "interrupts"]
    assert by_target["exits"]["status"] == "failed"
    assert by_target["exits"]["error"] == ("model._target_=badnets.exits: building it raised "
                                           "SystemExit: 0")
    assert by_target["interrupts"]["status"] == "failed"
    assert by_target["interrupts"]["error"] == ("model._target_=badnets.interrupts: building it "
                                                "raised KeyboardInterrupt")
    assert by_target["good"]["status"] == "completed"  # the sweep went on after both
    assert "hetsgd: error: model._target_=badnets.exits: building it raised SystemExit: 0" \
        in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.integration
@pytest.mark.parametrize("factory, mix", [
    ("hangs", ("devices=single_cpu",)),  # in the coordinator, which builds the model first
    ("hangs_in_a_worker", ("algo=hogwild", "devices=cpu", "devices.groups.cpu.count=2")),
])
@pytest.mark.wall
def test_a_factory_that_never_returns_fails_the_run_within_its_bound(
        user_code: Path, results_dir: Path, factory: str, mix: tuple[str, ...]) -> None:
    proc = _hetsgd(results_dir, user_code, "run", "model=custom",
                   f"model._target_=badnets.{factory}", "model.build_timeout_s=2", *mix, *FAST)
    assert proc.returncode == 1, proc.stderr
    (summary,) = _summaries(results_dir / "runs").values()
    expected = (f"model._target_=badnets.{factory}: importing it, calling it and a first "
                "forward did not end within model.build_timeout_s=2 s")
    assert summary["status"] == "failed"
    assert summary["error"].startswith(expected)
    assert f"hetsgd: error: {expected}" in proc.stderr


def test_a_factory_in_the_main_script_is_refused_in_one_line() -> None:
    problem = Problem("multiclass", 64, 10, None)
    with pytest.raises(UserError, match=r"^model._target_=__main__.net: worker processes cannot "
                                        r"import the script or notebook that starts the run"):
        problem.build_model(CustomModelConfig(_target_="__main__.net"), seed=0)


@pytest.mark.integration
@pytest.mark.wall  # a whole real-time run in its own process
def test_run_from_a_thread_that_is_not_the_main_one(results_dir: Path, tmp_path: Path) -> None:
    script = tmp_path / "in_a_thread.py"
    script.write_text(textwrap.dedent(f"""
        import threading
        import hetsgd
        results = []
        thread = threading.Thread(target=lambda: results.append(hetsgd.run(
            "devices=cpu", "devices.groups.cpu.count=2", "algo=hogwild", *{FAST!r})))
        thread.start()
        thread.join()
        print("STATUS", results[0].status, results[0].exit_code)
    """))
    proc = subprocess.run([sys.executable, str(script)], text=True, capture_output=True,
                          timeout=300, cwd=tmp_path)
    assert "STATUS completed 0" in proc.stdout, proc.stderr
    assert proc.returncode == 0


@pytest.mark.integration
def test_a_run_without_the_address_space_for_torch_fails_out_of_memory(
        results_dir: Path) -> None:
    # 500 MB: Python, Hydra and pandas load; torch's libraries cannot be mapped
    proc = _hetsgd(results_dir, None, "run", "devices=single_cpu", *FAST,
                   limit_bytes=500 * 2**20)
    assert proc.returncode == 1, proc.stderr
    (summary,) = _summaries(results_dir / "runs").values()
    assert summary["status"] == "failed"
    assert summary["error"].startswith("out of memory (")
    assert f"hetsgd: error: {summary['error']}" in proc.stderr


@pytest.mark.parametrize("raised, reason", [
    (MemoryError(), "out of memory (MemoryError)"),
    (ImportError("libtorch_cpu.so: failed to map segment from shared object"),
     "out of memory (ImportError: libtorch_cpu.so: failed to map segment from shared object)"),
    (OSError(12, "Cannot allocate memory"), "out of memory (OSError: [Errno 12] Cannot allocate "
                                            "memory)"),
    (RuntimeError("can't start new thread"), "out of memory (RuntimeError: can't start new "
                                             "thread)"),
    (ImportError("No module named 'mynets'"), None),
    (OSError(28, "No space left on device"), None),
])
def test_what_reads_as_out_of_memory(raised: BaseException, reason: str | None) -> None:
    assert out_of_memory(raised) == reason


_RAISES_SIGINT = textwrap.dedent("""
    import resource, signal, sys
    from hetsgd.data.native import loading_native
    if sys.argv[1] == "limited":
        resource.setrlimit(resource.RLIMIT_AS, (1 << 40, resource.RLIM_INFINITY))
    try:
        with loading_native():  # OpenBLAS's own raise(SIGINT), as it fails to start its threads
            signal.raise_signal(signal.SIGINT)
    except BaseException as exc:
        print(type(exc).__name__)
    signal.raise_signal(signal.SIGINT)  # after loading: Ctrl-C's as ever
""")


@pytest.mark.parametrize(("limit", "taken_for"), [("limited", "MemoryError"),
                                                  ("unlimited", "KeyboardInterrupt")])
def test_a_librarys_own_sigint_under_an_address_limit_is_out_of_memory(limit: str,
                                                                       taken_for: str) -> None:
    """Under `ulimit -v`, scikit-learn's OpenBLAS raises SIGINT on its process when it cannot
    start its threads: that is no Ctrl-C of the user's. Without a limit, nor after loading, a
    SIGINT is never taken for one."""
    done = subprocess.run([sys.executable, "-c", _RAISES_SIGINT, limit], text=True,
                          capture_output=True, timeout=60, preexec_fn=as_a_terminal_starts_it)
    assert done.stdout.split() == [taken_for]
    assert done.stderr.rstrip().endswith("KeyboardInterrupt")


@pytest.mark.parametrize("factory", ["two_classes", "one_logit"])
def test_a_binary_task_trains_a_factory_of_either_width(
        user_code: Path, results_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        factory: str) -> None:
    """Labels of two values are a binary task, which hands a factory ``num_classes=2``: its
    [B, 2] logits train, as [B, 1] do."""
    monkeypatch.setenv("HETSGD_DATA", str(tmp_path / "data"))
    monkeypatch.syspath_prepend(str(user_code))
    rng = np.random.default_rng(0)
    x = rng.standard_normal((300, 8)).astype(np.float32)
    np.savez(tmp_path / "cells.npz", X=x, y=(x[:, 0] > 0).astype(np.int64))
    result = hetsgd.run("dataset=files", f"dataset.path={tmp_path / 'cells.npz'}", "model=custom",
                        f"model._target_=badnets.{factory}", "devices=paper_hogbatch_v100",
                        "devices.groups.cpu.count=2", "budget.seconds=0.05", "budget.epochs=null",
                        "progress=false")
    assert result.status == "completed", result.summary.error
    summary = json.loads((result.run_dir / "summary.json").read_text())
    final = summary["final"]
    assert 0 <= final["test_acc"] <= 1 and final["train_loss"] < summary["initial"]["train_loss"]
