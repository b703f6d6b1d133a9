"""Sweeps of any length: a job's resources are given back (file descriptors stay flat over the
jobs), a sweep never overwrites an earlier one's folder, a full disk is named with its file and
still leaves the summary of the jobs that ran, and a tracker that stalls costs one timeout and
one warning per sweep."""

from __future__ import annotations

import contextlib
import json
import logging
import resource
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pandas as pd
import psutil
import pytest
from hydra.core.utils import JobReturn, JobStatus
from omegaconf import OmegaConf
from processes import start

from hetsgd.invocation import invoke
from hetsgd.outputs.run_directory import WriteError
from hetsgd.outputs.sweep import SweepReport

SHORT = ("budget.seconds=0.2", "budget.epochs=null", "progress=false", "devices=single_cpu")

#: A Hydra callback that appends the job process's count of open file descriptors, as each job
#: ends, to the file $FD_PROBE.
FD_PROBE = '''
import os
from hydra.experimental.callback import Callback


class FdProbe(Callback):
    def on_job_end(self, config, job_return, **kwargs):
        with open(os.environ["FD_PROBE"], "a") as out:
            out.write(f"{len(os.listdir('/proc/self/fd'))}\\n")
'''


def hetsgd(*args: str, env: dict[str, str] | None = None, fd_limit: int | None = None,
           ) -> subprocess.CompletedProcess:
    def limit() -> None:
        if fd_limit is not None:
            resource.setrlimit(resource.RLIMIT_NOFILE, (fd_limit, fd_limit))

    return subprocess.run([sys.executable, "-m", "hetsgd", *args], capture_output=True,
                          text=True, timeout=300, env=env, preexec_fn=limit)


def the_sweep(results: Path) -> Path:
    sweep, = (results / "sweeps").iterdir()
    return sweep


@pytest.mark.integration
@pytest.mark.wall
@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="counts descriptors in /proc")
def test_a_long_sweep_holds_the_same_file_descriptors_from_job_to_job(
        results_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # every job a new seed, so new data: each copy prepared holds a descriptor per array, and
    # only the latest few copies are kept
    (tmp_path / "fd_probe.py").write_text(FD_PROBE)
    probe = tmp_path / "fds.txt"
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    monkeypatch.setenv("FD_PROBE", str(probe))
    monkeypatch.setenv("HETSGD_DATA", str(tmp_path / "data"))
    ran = hetsgd("run", "-m", "algo=hogwild", "devices=cpu", "devices.groups.cpu.count=2",
                 "seed=range(16)", *SHORT[:3], "+hydra.callbacks.fd_probe._target_=fd_probe.FdProbe",
                 fd_limit=64)
    statuses = pd.read_csv(the_sweep(results_dir) / "summary.csv")["status"].tolist()
    assert statuses == ["completed"] * 16, ran.stderr[-3000:]
    fds = [int(line) for line in probe.read_text().split()]
    assert len(fds) == 16
    # the copies kept fill up over the first jobs; from then on no job holds more than before
    assert max(fds[5:]) <= fds[4], fds


def test_a_sweep_keeps_no_jobs_configs_once_it_has_ended() -> None:
    """Hydra's launcher keeps every job's return until the sweep ends: with the job's configs
    (about 0.2 MB), a sweep's memory grows job by job. What it reads of a return stays."""
    job = JobReturn(overrides=["seed=0"], cfg=OmegaConf.create({"seed": 0}),
                    hydra_cfg=OmegaConf.create({"hydra": {"job": {"num": 0}}}),
                    status=JobStatus.COMPLETED)
    SweepReport().on_job_end(OmegaConf.create(), job)
    assert job.cfg is None and job.hydra_cfg is None
    assert job.overrides == ["seed=0"] and job.return_value is None


@pytest.mark.integration
@pytest.mark.wall
def test_a_sweep_into_an_earlier_sweeps_folder_is_refused_before_any_job(
        results_dir: Path, tmp_path: Path) -> None:
    folder = tmp_path / "my sweep"
    first = hetsgd("run", "-m", "seed=0,1", *SHORT, f"hydra.sweep.dir={folder}")
    assert first.returncode == 0, first.stderr[-2000:]
    summary = (folder / "0_seed=0" / "summary.json").read_text()
    again = hetsgd("run", "-m", "seed=0,1,2", *SHORT, f"hydra.sweep.dir={folder}")
    assert again.returncode == 1
    assert again.stderr.strip().splitlines() == [
        f"hetsgd: error: hydra.sweep.dir {folder} already holds a sweep, whose jobs this one "
        "would overwrite: choose another hydra.sweep.dir (or leave it out for a new folder "
        "under results/sweeps/), or move that sweep away first"]
    assert (folder / "0_seed=0" / "summary.json").read_text() == summary
    assert not (folder / "2_seed=2").exists()
    # a single run may still name any folder; only a sweep's is checked
    assert hetsgd("run", *SHORT, f"hydra.sweep.dir={folder}").returncode == 0


#: `hetsgd run` with Hydra's own writes of job 1's `.hydra/` files failing as on a full disk.
FULL_AT_JOB_1 = '''
import errno, sys
import hydra.core.utils as hydra_utils
from hetsgd.cli import main

save = hydra_utils._save_config


def full(cfg, filename, output_dir):
    if output_dir.parent.name.startswith("1_"):  # the folder is made, its first file is not
        output_dir.mkdir(parents=True, exist_ok=True)
        raise OSError(errno.ENOSPC, "No space left on device")
    save(cfg, filename, output_dir)


hydra_utils._save_config = full
sys.argv = ["hetsgd", *sys.argv[1:]]
main()
'''


@pytest.mark.integration
@pytest.mark.wall
def test_a_full_disk_between_jobs_names_the_job_folder_and_keeps_the_summary(
        results_dir: Path) -> None:
    ran = subprocess.run([sys.executable, "-c", FULL_AT_JOB_1, "run", "-m", "seed=0,1,2", *SHORT],
                         capture_output=True, text=True, timeout=300)
    sweep = the_sweep(results_dir)
    assert ran.returncode == 1
    assert "Traceback" not in ran.stderr
    errors = [line for line in ran.stderr.splitlines() if line.startswith("hetsgd: error:")]
    assert errors == [f"hetsgd: error: no space left on device, writing {sweep / '1_seed=1'}; "
                      f"the sweep stopped there (summary and report of those that ran in "
                      f"{sweep})"]
    summary = pd.read_csv(sweep / "summary.csv")
    assert summary[["job", "status"]].values.tolist() == [[0, "completed"], [1, "crashed"]]
    assert (sweep / "report.md").is_file()


def test_a_sweep_summary_the_full_disk_refuses_is_one_line(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    import errno

    from hetsgd.outputs import sweep

    def full(sweep_dir: Path, *args: object) -> str:
        raise WriteError.of(sweep_dir / "summary.csv", OSError(errno.ENOSPC, "No space"))

    monkeypatch.setattr(sweep, "finalize_sweep", full)
    config = {"hydra": {"sweep": {"dir": str(tmp_path)}}}
    from omegaconf import OmegaConf

    with caplog.at_level(logging.WARNING):
        SweepReport().on_multirun_end(OmegaConf.create(config))
    assert [(r.levelname, r.getMessage(), r.exc_info) for r in caplog.records] == [
        ("ERROR", f"could not write the summary and report of the sweep in {tmp_path}: no space "
                  f"left on device, writing {tmp_path / 'summary.csv'}", None)]


@pytest.fixture
def silent_server() -> Iterator[int]:
    """A server on 127.0.0.1 that accepts connections and never answers; closed after the
    test. Its port."""
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(0.1)
    stop, held = threading.Event(), []

    def accept() -> None:
        while not stop.is_set():
            try:
                held.append(server.accept()[0])
            except TimeoutError:
                pass

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield server.getsockname()[1]
    finally:
        stop.set()
        thread.join()
        for conn in held:
            conn.close()
        server.close()


@pytest.mark.integration
@pytest.mark.wall
def test_a_silent_tracking_server_costs_one_warning_per_sweep(results_dir: Path,
                                                             silent_server: int) -> None:
    pytest.importorskip("mlflow")
    ran = hetsgd("run", "-m", "seed=0,1,2", *SHORT, "logger=mlflow",
                 f"logger.mlflow.tracking_uri=http://127.0.0.1:{silent_server}",
                 "logger.mlflow.timeout_s=1")
    assert ran.returncode == 0, ran.stderr[-2000:]
    output = ran.stdout + ran.stderr
    warned = [line for line in output.splitlines() if "mlflow: could not log" in line]
    assert len(warned) == 1, warned
    assert "0_seed=0" in warned[0] and "timed out" in warned[0]
    assert warned[0].endswith("; mlflow is left out for the rest of the sweep")
    assert "Traceback" not in output
    sweep = the_sweep(results_dir)
    assert [json.loads((job / "summary.json").read_text())["status"]
            for job in sorted(sweep.glob("*_seed=*"))] == ["completed"] * 3


def forkserver_of(proc: subprocess.Popen, timeout_s: float = 90) -> psutil.Process:
    """The forkserver the command `proc` started, once it runs."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for child in psutil.Process(proc.pid).children():
            with contextlib.suppress(psutil.NoSuchProcess):
                if "multiprocessing.forkserver" in " ".join(child.cmdline()):
                    return child
        time.sleep(0.05)
    raise AssertionError("no forkserver started")


def await_file(pattern: str, folder: Path, holding: str = "", timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if any(holding.encode() in f.read_bytes() for f in folder.glob(pattern) if f.is_file()):
            return
        time.sleep(0.05)
    raise AssertionError(f"no {pattern} under {folder}")


def job_errors(results: Path) -> list[tuple[str, str | None]]:
    sweep = the_sweep(results)
    summaries = [json.loads((sweep / f"{job}_seed={job}" / "summary.json").read_text())
                 for job in range(len(list(sweep.glob("*_seed=*"))))]
    return [(s["status"], s.get("error")) for s in summaries]


@pytest.mark.integration
@pytest.mark.wall
def test_a_stopped_forkserver_fails_one_job_and_the_next_starts_a_new_one(
        results_dir: Path) -> None:
    """The stop lands after job 0, before job 1 has its workers or, on a slow poll, while
    job 1 trains with the workers it already has: then job 2 is the one that finds the
    forkserver stopped. Either way one job fails and the next runs on a new forkserver."""
    proc = start(results_dir, "run", "-m", "seed=0,1,2,3", "budget.seconds=0.5",
                 *SHORT[1:], "workers.start_timeout_s=15")
    try:
        server = forkserver_of(proc)
        await_file("sweeps/*/0_seed=0/summary.json", results_dir, holding='"completed"')
        server.suspend()  # SIGSTOP, after job 0
        output, _ = proc.communicate(timeout=300)
    finally:
        proc.kill()
    assert not server.is_running() or server.status() == psutil.STATUS_ZOMBIE
    stalled = (f"the forkserver (pid {server.pid}) did not start the workers within 15 s "
               "(workers.start_timeout_s; stopped or stuck): killed, the next run starts a new "
               "one")
    errors = job_errors(results_dir)
    failures = [job for job, (status, _) in enumerate(errors) if status == "failed"]
    assert failures in ([1], [2]), (errors, output[-3000:])
    failed, = failures
    assert errors == [("completed", None)] * failed + [("failed", stalled)] + [
        ("completed", None)] * (3 - failed), output[-3000:]
    assert proc.returncode == 1


@pytest.mark.integration
@pytest.mark.wall
def test_a_forkserver_killed_mid_job_is_named_and_the_next_job_runs(results_dir: Path) -> None:
    proc = start(results_dir, "run", "-m", "seed=0,1", "budget.seconds=3", *SHORT[1:])
    try:
        server = forkserver_of(proc)
        await_file("sweeps/*/0_seed=0/snapshots/*.pt", results_dir)
        server.kill()
        output, _ = proc.communicate(timeout=300)
    finally:
        proc.kill()
    assert job_errors(results_dir)[0] == (
        "failed", f"the forkserver (pid {server.pid}) that started the workers was killed by "
                  "SIGKILL (signal 9), ending worker 0 (cpu)"), output[-3000:]
    assert job_errors(results_dir)[1][0] == "completed"


@pytest.mark.integration
def test_a_tuned_comparison_refused_before_its_first_trial_leaves_no_folder(
        tmp_path: Path) -> None:
    """Its search's claim (``tuning/.claimed``) and ``multirun.yaml`` were left, and refused the
    corrected rerun into that folder as claimed by another sweep."""
    sweep = tmp_path / "s"
    tuned = ["-m", "+experiment=tuned_comparison", "seed=0", "tuning.methods=sync",
             f"hydra.sweep.dir={sweep}"]
    for wrong, said in ((("tuning.search.optim.lr='0.01,0.1'",  # a trial's override: its
                          "+tuning.trials.budget.seconds=abc"), "abc"),  # sweep stops
                        (("tuning.search.optim.lr='0.01,O.1'",),  # a grid value: refused before
                         "'O.1' does not compose")):
        invocation = invoke([*tuned, *wrong])
        assert invocation.code == 1 and len(invocation.errors) == 1, invocation.errors
        assert said in invocation.errors[0], invocation.errors
        assert not sweep.exists(), sorted(sweep.rglob("*"))
