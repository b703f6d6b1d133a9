"""Run folders and stores are data: `hetsgd recover` and a resume call no code a folder names
unless the user names it too, torchrun's store is never unpickled, a folder's symbolic links
take no writes, what a folder says is printed with its control characters escaped, and a
tracker's password is written nowhere."""

from __future__ import annotations

import json
import os
import pickle
import resource
import shutil
import subprocess
import sys
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch.distributed as dist
import yaml
from typer.testing import CliRunner, Result

from hetsgd import algorithms
from hetsgd.cli import app
from hetsgd.engines.ranks.handoff import receive
from hetsgd.errors import UserError
from hetsgd.outputs.checkpoint import latest_checkpoint
from hetsgd.outputs.index import CONFIG, OVERRIDES
from hetsgd.outputs.run_directory import SUMMARY, RunDirectory
from hetsgd.outputs.safe_text import redacted, shown
from hetsgd.outputs.terminal import run_script
from hetsgd.runs.setup import Handoff
from hetsgd.workers import expand
from tests.conftest import as_crashed, run_config

ESCAPES = "\x1b]0;owned\x07\x1b]52;c;Zm9v\x07\x1b[2J\x9b31m"


def _hetsgd(*args: str) -> Result:
    return CliRunner().invoke(app, list(args))


def _craft(config: Path, overrides: Path, src: Path, dst: Path) -> None:
    """Make the recorded config name ``shutil.copyfile`` as its model's factory, as someone
    who hands over the folder could."""
    recorded = yaml.safe_load(config.read_text())
    recorded["model"] = {"name": "custom", "_target_": "shutil.copyfile",
                         "kwargs": {"src": str(src), "dst": str(dst)}}
    config.write_text(yaml.safe_dump(recorded))
    kept = [o for o in yaml.safe_load(overrides.read_text()) if not o.startswith("model=")]
    overrides.write_text(yaml.safe_dump([*kept, "model=custom"]))


@pytest.mark.integration
def test_recover_calls_no_target_the_folder_names_unless_the_user_names_it(
        run_dir: Path, tmp_path: Path) -> None:
    src, dst = tmp_path / "evil.pth", tmp_path / "site-packages" / "zz.pth"
    src.write_text("import os\n")
    dst.parent.mkdir()
    as_crashed(run_dir)
    _craft(run_dir / "config.yaml", run_dir / OVERRIDES, src, dst)
    refused = _hetsgd("recover", str(run_dir))
    assert refused.exit_code == 1 and not dst.exists()
    line, = refused.stderr.splitlines()
    assert line == (f"hetsgd: error: {run_dir} names model._target_ 'shutil.copyfile', which "
                    "hetsgd would import and call; what it reads back is data and may come "
                    "from anyone, so it calls only what you name: pass --model-target "
                    "shutil.copyfile to call it")
    # named by the user, it is called (and refused as no model only then)
    named = _hetsgd("recover", str(run_dir), "--model-target", "shutil.copyfile")
    assert named.exit_code == 1 and dst.read_text() == "import os\n"
    assert "not an nn.Module" in named.stderr


@pytest.mark.integration
def test_a_resume_calls_no_target_the_checkpoint_names(run_dir: Path, tmp_path: Path) -> None:
    src, dst = tmp_path / "evil.pth", tmp_path / "zz.pth"
    src.write_text("import os\n")
    version = latest_checkpoint(run_dir)
    assert version is not None
    _craft(version / "run_config.yaml", version / "run_overrides.yaml", src, dst)
    refused = _hetsgd("run", f"resume={run_dir}", "budget.seconds=2", "progress=false")
    assert refused.exit_code == 1 and not dst.exists()
    line, = refused.stderr.splitlines()
    assert "names model._target_ 'shutil.copyfile'" in line
    assert line.endswith("add model=custom model._target_=shutil.copyfile to call it")


@pytest.mark.integration
def test_a_folders_overrides_set_no_hydra_search_path(run_dir: Path, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Composing ``hydra.searchpath=[pkg://M]`` imports M: a folder's recorded overrides are
    refused before anything is composed, for recovery and for a resume alike."""
    marker = tmp_path / "imported"
    (tmp_path / "planted").mkdir()
    (tmp_path / "planted" / "hetsgd_planted.py").write_text(
        f"open({str(marker)!r}, 'w').close()\n")
    monkeypatch.syspath_prepend(str(tmp_path / "planted"))
    planted = "hydra.searchpath=[pkg://hetsgd_planted]"
    version = latest_checkpoint(run_dir)
    assert version is not None
    for overrides in (run_dir / OVERRIDES, version / "run_overrides.yaml"):
        overrides.write_text(yaml.safe_dump([*yaml.safe_load(overrides.read_text()), planted]))
    as_crashed(run_dir)
    for refused in (_hetsgd("recover", str(run_dir)),
                    _hetsgd("run", f"resume={run_dir}", "budget.seconds=2", "progress=false")):
        assert refused.exit_code == 1 and not marker.exists()
        line, = refused.stderr.splitlines()
        assert f"records the override '{planted}'" in line


@pytest.mark.parametrize(("uri", "written"), [
    ("http://user:s3cretPW@127.0.0.1:9/", "http://user:***@127.0.0.1:9/"),
    ("https://ghp_t0kenVAL@example.org/x", "https://***@example.org/x"),
    ("http://h:9/?run=1&api_key=t0kenVAL", "http://h:9/?run=1&api_key=***"),
    ("http://127.0.0.1:9/", "http://127.0.0.1:9/")])
def test_a_uris_secrets_are_redacted_and_nothing_else(uri: str, written: str) -> None:
    assert redacted(f"logging to {uri}.") == f"logging to {written}."
    assert redacted(written) == written


def test_a_log_keeps_its_layout_and_loses_its_escapes() -> None:
    assert shown(f"\t#0 : algo=hogwild\n{ESCAPES}", lines=True) == (
        "\t#0 : algo=hogwild\n\\x1b]0;owned\\x07\\x1b]52;c;Zm9v\\x07\\x1b[2J\\x9b31m")
    assert shown("a\tb\nc") == "a\\x09b\\x0ac"


def test_a_plan_travels_as_data_and_comes_back_equal() -> None:
    cfg = run_config("algo=local_sgd", "devices=emulated", "algo.tau={accel: 3, cpu: 1}")
    plan = algorithms.get(cfg.algo.name).plan(cfg, expand(cfg.devices))
    sent = json.loads(json.dumps(Handoff(plan=plan).to_plain()))
    assert Handoff.from_plain(sent) == Handoff(plan=plan)
    assert Handoff.from_plain(json.loads(json.dumps(Handoff(error="no").to_plain()))).error == "no"


def test_a_plan_of_another_shape_is_refused() -> None:
    cfg = run_config("devices=single_cpu")
    sent = Handoff(plan=algorithms.get("sync").plan(cfg, expand(cfg.devices))).to_plain()
    sent["plan"]["cfg"]["schemas"]["algo"] = "os.system"
    with pytest.raises(UserError, match="no algo schema is called 'os.system'"):
        Handoff.from_plain(sent)
    sent = Handoff(plan=algorithms.get("sync").plan(cfg, expand(cfg.devices))).to_plain()
    sent["plan"]["workers"][0]["threads"] = "1; rm -rf /"
    with pytest.raises(UserError, match="not a worker"):
        Handoff.from_plain(sent)


class _Payload:
    """What a pickle in the store would run on a follower, if it were unpickled."""

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return os.mkdir, (os.environ["HETSGD_PICKLED"],)


def test_a_follower_never_unpickles_the_store(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, timeout=timedelta(seconds=10),
                          wait_for_workers=False)
    marker = tmp_path / "pickled"
    monkeypatch.setenv("HETSGD_PICKLED", str(marker))
    monkeypatch.setenv("TORCHELASTIC_USE_AGENT_STORE", "True")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(store.port))
    store.set("hetsgd/handoff/0", pickle.dumps(_Payload()))  # type: ignore[arg-type]
    with pytest.raises(UserError, match="not rank 0's .not JSON"):
        receive()
    assert not marker.exists()


def test_a_follower_builds_only_the_model_its_own_command_names(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The store holds rank 0's plan, which anyone who reaches its port could have written: a
    torchrun follower refuses a factory its own command line (the same on every rank) does
    not name, and finds one named in its own --config-dir."""
    from hetsgd.runs import follow

    custom = ("model=custom", "model._target_=shutil.copyfile")
    cfg = run_config("algo=sync", "devices=single_cpu", *custom)
    planted = Handoff(plan=algorithms.get("sync").plan(cfg, expand(cfg.devices))).to_plain()
    monkeypatch.setattr(follow, "torchrun", lambda: SimpleNamespace(rank=1))
    monkeypatch.setattr(follow, "receive", lambda: planted)
    with pytest.raises(UserError, match=r"^rank 0's plan in the torch.distributed store names "
                                        r"model._target_ 'shutil.copyfile'.*give "
                                        r"model._target_=shutil.copyfile on the command line"):
        follow.follow(["algo=sync", "devices=single_cpu"])
    assert follow._named_here(["-m", "algo=sync", *custom]) == ["shutil.copyfile"]
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "mine.yaml").write_text(
        "defaults:\n  - custom\n  - _self_\n_target_: shutil.copyfile\n")
    assert follow._named_here(["--config-dir", str(tmp_path), "model=mine"]) == ["shutil.copyfile"]


@pytest.mark.integration
@pytest.mark.parametrize("linked", ["checkpoint", "figures"])
def test_a_resume_never_writes_through_a_symbolic_link(run_dir: Path, tmp_path: Path,
                                                       linked: str) -> None:
    outside = tmp_path / "outside"
    shutil.move(run_dir / linked, outside)
    (run_dir / linked).symlink_to(outside, target_is_directory=True)
    before = sorted(str(p.relative_to(outside)) for p in outside.rglob("*"))
    result = _hetsgd("run", f"resume={run_dir}", "budget.seconds=2", "progress=false")
    assert result.exit_code == 1
    line, = result.stderr.splitlines()
    assert line.startswith(f"hetsgd: error: resume={run_dir}: {run_dir / linked} is a symbolic "
                           "link;")
    assert sorted(str(p.relative_to(outside)) for p in outside.rglob("*")) == before


@pytest.mark.integration
@pytest.mark.timeout(120)  # the FIFO linked to waits for a writer that never comes
def test_recover_reads_nothing_through_a_symbolic_link(run_dir: Path, tmp_path: Path) -> None:
    as_crashed(run_dir)
    os.mkfifo(tmp_path / "fifo")
    link = run_dir / "snapshots" / "000000000001.pt"
    link.symlink_to(tmp_path / "fifo")
    result = _hetsgd("recover", str(run_dir))
    assert result.exit_code == 1
    assert result.stderr.splitlines() == [f"hetsgd: error: cannot recover {run_dir}: {link} is a "
                                          "symbolic link; hetsgd writes a run's files only inside "
                                          "its folder, never through a link: replace it with what "
                                          "it points to, or remove it"]


@pytest.mark.integration
def test_hetsgd_plot_never_writes_through_a_symbolic_link(run_dir: Path, tmp_path: Path,
                                                          caplog: pytest.LogCaptureFixture) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    shutil.rmtree(run_dir / "figures")
    (run_dir / "figures").symlink_to(outside, target_is_directory=True)
    result = _hetsgd("plot", str(run_dir))
    assert result.exit_code == 1 and "no figures written under" in result.output
    assert f"{run_dir / 'figures'} is a symbolic link" in caplog.text
    assert not list(outside.iterdir())


# seven levels of ten aliases: 10**7 strings once expanded, from 379 bytes
ALIASES = "\n".join(["- &a0 [x, x, x, x, x, x, x, x, x, x]", *(
    f"- &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 8))]) + "\n"


@pytest.mark.parametrize("damage,why", [
    ("aliases", "an alias (*a0), which no run writes (line 2)"),
    ("nested", "nested too deep"),
    ("not_utf8", "'utf-8' codec can't decode byte 0xff in position 2: invalid start byte"),
    ("too_large", "larger than 1 MiB"),
])
def test_a_runs_yaml_is_read_as_plain_data_within_bounds(
        run_dir: Path, damage: str, why: str, caplog: pytest.LogCaptureFixture) -> None:
    """A run folder's YAML holds a few kilobytes of plain values: one that expands (aliases),
    nests past Python's stack, is not text or is huge is named, and its run still listed."""
    file = run_dir / OVERRIDES
    file.write_bytes({"aliases": ALIASES.encode(), "nested": b"[" * 5000 + b"]" * 5000,
                      "not_utf8": b"- \xff\n", "too_large": b"- x\n" * (1 << 19)}[damage])
    result = _hetsgd("runs", str(run_dir.parent))
    assert result.exit_code == 0, result.output
    assert [r.getMessage() for r in caplog.records if r.levelname == "WARNING"] == [
        f"cannot read {file}: {why}; the run is listed without its overrides"]
    assert "1 run(s) under" in result.output


def test_a_runs_damaged_config_is_named_not_read_as_no_settings_in_silence(
        run_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The report compares runs by their config.yaml's settings (optim, dataset): one that does
    not parse read as none at all, without a word."""
    (run_dir / CONFIG).write_text("optim: [\n")
    result = _hetsgd("runs", str(run_dir.parent))
    assert result.exit_code == 0, result.output
    assert [r.getMessage() for r in caplog.records if r.levelname == "WARNING"] == [
        f"unreadable {run_dir / CONFIG}: expected the node content, but found '<stream end>' "
        "(line 2); the run is read without its config"]


def _bounded(*args: str) -> subprocess.CompletedProcess[str]:
    """`hetsgd ARGS` in a process of its own, so that a read that waits forever (a FIFO) or
    never ends (``/dev/zero``) fails the test instead of holding it: 2 minutes, 4 GiB."""
    def limited() -> None:  # `ulimit -v`, in the child only
        resource.setrlimit(resource.RLIMIT_AS, (4 << 30, resource.RLIM_INFINITY))

    return subprocess.run([sys.executable, "-m", "hetsgd", *args], capture_output=True,
                          text=True, timeout=120, preexec_fn=limited, check=False)


@pytest.mark.parametrize("target,why", [("summary.json", "Too many levels of symbolic links"),
                                        ("/nonexistent/summary.json", "No such file or directory")])
def test_a_summary_that_links_nowhere_is_unreadable_not_missing(
        tmp_path: Path, target: str, why: str) -> None:
    """A link to nowhere (or to itself) is a summary that cannot be read, whose run failed, as
    docs/runs.md says; it read as no summary, a run killed before writing one."""
    from hetsgd.outputs.index import summary_values

    (tmp_path / SUMMARY).symlink_to(target)
    summary, unreadable = summary_values(tmp_path)
    assert (summary["status"], summary["error"], unreadable) == (
        "failed", f"unreadable {SUMMARY}: {why}", why)


@pytest.mark.integration
@pytest.mark.parametrize("kind", ["a FIFO or pipe", "a character device"])
def test_a_summary_that_is_no_regular_file_lists_its_run_as_failed(run_dir: Path,
                                                                   kind: str) -> None:
    """A FIFO waits for a writer that never comes, ``/dev/zero`` never ends: neither is read,
    and its run is listed as failed, in one line saying why."""
    summary = run_dir / SUMMARY
    summary.unlink()
    if kind == "a FIFO or pipe":
        os.mkfifo(summary)
    else:
        summary.symlink_to("/dev/zero")
    why = f"unreadable {SUMMARY}: not a regular file but {kind}"
    listed = _bounded("runs", str(run_dir.parent))
    assert listed.returncode == 0, listed.stderr
    assert listed.stderr.splitlines() == [
        f"unreadable {summary}: not a regular file but {kind}; the run is listed as failed"]
    assert "1 run(s) under" in listed.stdout and "failed" in listed.stdout.split()
    reported = _bounded("report", str(run_dir.parent))
    assert reported.returncode == 0, reported.stderr
    assert "Traceback" not in reported.stderr
    assert f"- `run` (algo sync, devices cpu, dataset digits, model mlp, seed 0): **failed**: " \
           f"{why}" in (run_dir.parent / "report.md").read_text()


@pytest.mark.integration
@pytest.mark.parametrize(("name", "command", "said"), [
    ("convergence", "report", "left out {run_dir}: "),
    ("workers", "report", "left out of the time split: "),
    ("utilization", "plot", "no figures from utilization.csv of {run_dir}: "),
])
def test_a_csv_that_is_a_fifo_is_never_waited_for(run_dir: Path, name: str, command: str,
                                                  said: str) -> None:
    """A run's CSV that is a FIFO is refused, not opened for a writer that never comes: its run
    is left out of what needs it, with one line naming the file, and the command ends."""
    file = run_dir / f"{name}.csv"
    file.unlink()
    os.mkfifo(file)
    done = _bounded(command, str(run_dir.parent))
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    line = (said.format(run_dir=run_dir)
            + f"cannot read {file}: not a regular file but a FIFO or pipe")
    assert line in done.stderr.splitlines()
    if name == "convergence":
        assert (f"**unusable**: cannot read {file}: not a regular file but a FIFO or pipe"
                in (run_dir.parent / "report.md").read_text())


def test_a_resume_refuses_a_checkpoints_config_that_expands(run_dir: Path) -> None:
    version = latest_checkpoint(run_dir)
    assert version is not None
    (version / "run_config.yaml").write_text(f"seed: 0\nbomb:\n{ALIASES}")
    result = _hetsgd("run", f"resume={run_dir}", "progress=false")
    assert result.exit_code == 1
    assert result.stderr.splitlines() == [
        f"hetsgd: error: cannot read {version / 'run_config.yaml'}: an alias (*a0), which no run "
        "writes (line 4)"]


@pytest.mark.integration
def test_report_escapes_what_a_run_folder_says(run_dir: Path, tmp_path: Path) -> None:
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    completed = Path(shutil.copytree(run_dir, sweep / "completed", symlinks=True))
    # a setting every run shares ("Settings every run shares: ...") and a group (report.csv's
    # columns share_<group>_mean...), each with its escapes
    (completed / OVERRIDES).write_text(json.dumps([f"+note=a{ESCAPES}"]))
    summary = json.loads((completed / SUMMARY).read_text())
    RunDirectory(completed).write_summary({**summary, "update_share": {f"cpu{ESCAPES}": 1.0}})
    failed = Path(shutil.copytree(completed, sweep / f"run{ESCAPES}", symlinks=True))
    summary = json.loads((failed / SUMMARY).read_text())
    RunDirectory(failed).write_summary({**summary, "status": "failed",
                                        "algo": f"sync{ESCAPES}", "error": f"boom{ESCAPES}"})
    result = _hetsgd("report", str(sweep))
    assert result.exit_code == 0, result.output
    files = [(sweep / name).read_text() for name in ("report.md", "report.csv")]
    for text in (result.stdout + result.stderr, *files):
        assert not [c for c in text if ord(c) < 0x20 and c != "\n" or 0x7F <= ord(c) < 0xA0]
    escaped = "\\x1b]0;owned\\x07\\x1b]52;c;Zm9v\\x07\\x1b[2J\\x9b31m"
    for text in (" ".join(result.stdout.split()), files[0]):  # the terminal's lines wrap
        assert f"- `run{escaped}` (algo sync{escaped}, " in text
        assert f"**failed**: boom{escaped}" in text
    assert f"Settings every run shares: +note=a{escaped}." in files[0]
    assert f"share_cpu{escaped}_mean" in files[1]


@pytest.mark.parametrize("round_", ["x", "inf", ""])
def test_a_tuning_csv_is_data_its_names_escaped_a_damaged_round_none(round_: str) -> None:
    """tuning.csv is read back like every file of a sweep: a method or edge carrying escapes
    reached the report raw, and a round that is no finite number was a traceback."""
    import pandas as pd

    from hetsgd.outputs.search_cost import edge_mark, search_cost

    trials = pd.DataFrame([{"method": f"hog{ESCAPES}", "chosen": True, "round": round_,
                            "edge": f"optim.lr:high{ESCAPES}"}])
    assert search_cost(trials) == (
        "Search: 1 trials. On an edge of the values tried, so the optimum may lie beyond: "
        f"hog{shown(ESCAPES)} (optim.lr:high{shown(ESCAPES)}).")
    assert edge_mark(trials, "optim.lr") == f" (high{shown(ESCAPES)} edge)"


@pytest.mark.integration
def test_a_trackers_password_is_written_and_printed_nowhere(tmp_path: Path) -> None:
    results = tmp_path / "results"
    env = {**os.environ, "HETSGD_RESULTS": str(results), "HETSGD_DATA": str(tmp_path / "data")}
    done = subprocess.run(
        [sys.executable, "-m", "hetsgd", "run", "-m", "seed=0", "devices=single_cpu",
         "budget.seconds=0.5", "budget.epochs=null", "progress=false", "logger=mlflow",
         "logger.mlflow.timeout_s=2", "logger.mlflow.retries=0",
         "logger.mlflow.tracking_uri='http://user:s3cretPW@127.0.0.1:9/?token=t0kenVAL'"],
        capture_output=True, text=True, env=env, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    printed = done.stdout + done.stderr
    assert "mlflow: could not log the run" in printed  # the warning, redacted
    assert "http://user:***@127.0.0.1:9/?token=***" in printed
    files = [p for p in results.rglob("*") if p.is_file()]
    assert any(p.name == "multirun.yaml" for p in files) and any(p.name == "cli.log" for p in files)
    for secret in ("s3cretPW", "t0kenVAL"):
        assert secret not in printed
        assert not [p for p in files if secret.encode() in p.read_bytes()]


def test_a_scripts_error_is_one_line_escaped_and_without_secrets(
        capsys: pytest.CaptureFixture[str]) -> None:
    def refuses() -> int:
        raise UserError("cannot read /runs/a\x1b[2J\nb from https://me:pw@host/db?token=abc")

    with pytest.raises(SystemExit) as ended:
        run_script("tool", refuses)
    assert ended.value.code == 1
    assert capsys.readouterr().err == \
        "tool: cannot read /runs/a\\x1b[2J b from https://me:***@host/db?token=***\n"
    for status, code in ((None, 0), (0, 0), (3, 3)):
        with pytest.raises(SystemExit) as ended:
            run_script("tool", lambda status=status: status)
        assert ended.value.code == code
