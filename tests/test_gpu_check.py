"""scripts/gpu_check.sh without a usable GPU: one line and exit 2 before anything runs; its offline
setup of the venv, with python3 a venv of its own."""

from __future__ import annotations

import itertools
import shlex
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest
import torch
from conftest import run_config

ROOT = Path(__file__).resolve().parents[1]
# where a venv keeps its installed modules, below its root (lib/pythonX.Y/site-packages)
PURELIB = Path(sysconfig.get_path("purelib")).relative_to(sys.prefix)


@pytest.mark.integration
def test_gpu_check_without_a_gpu_says_so_and_exits_2_at_once(tmp_path: Path) -> None:
    fake = tmp_path / "bin"
    fake.mkdir()
    # nvidia-smi as it answers on a machine with a driver and no device: no GPU line, exit 6.
    (fake / "nvidia-smi").write_text("#!/bin/sh\necho 'No devices were found'\nexit 6\n")
    (fake / "nvidia-smi").chmod(0o755)
    out = tmp_path / "check"
    done = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_check.sh"), str(out)],
                          env={"PATH": f"{fake}:/usr/bin:/bin"}, capture_output=True, text=True,
                          timeout=30)
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr.count("\n") == 1 and "no CUDA GPU here" in done.stderr
    assert not out.exists()


def _wheel(folder: Path, name: str) -> None:
    """A wheel of one empty module ``name``: what the offline setup installs from WHEELHOUSE."""
    dist = f"{name}-0.dist-info"
    files = {f"{name}.py": "",
             f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: 0\n",
             f"{dist}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
                              "Tag: py3-none-any\n"}
    files[f"{dist}/RECORD"] = "".join(f"{path},,\n" for path in [*files, f"{dist}/RECORD"])
    with zipfile.ZipFile(folder / f"{name}-0-py3-none-any.whl", "w") as wheel:
        for path, text in files.items():
            wheel.writestr(path, text)


@pytest.mark.integration
@pytest.mark.skipif(sys.prefix == sys.base_prefix, reason="needs this python to be a venv")
def test_the_offline_venv_sees_python3s_own_packages_when_python3_is_a_venv(tmp_path: Path) -> None:
    """The CUDA image's python3 is a venv holding torch; a --system-site-packages venv made from
    it reaches only the interpreter beneath, so the check found no torch there. Here python3 is
    this test's venv (torch, pip, setuptools) and a GPU is faked: the setup must give the new
    venv torch from python3 and the wheelhouse's module from its own site-packages."""
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "nvidia-smi").write_text("#!/bin/sh\necho 'GPU 0: NVIDIA H200 (UUID: GPU-0)'\n")
    (fake / "python3").write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    for tool in fake.iterdir():
        tool.chmod(0o755)
    repo = tmp_path / "repo"  # the script's root: a project whose only entry point is `hetsgd`
    (repo / "scripts").mkdir(parents=True)
    shutil.copy(ROOT / "scripts" / "gpu_check.sh", repo / "scripts")
    (repo / "probe.py").write_text("def main() -> None:\n    pass\n")
    (repo / "pyproject.toml").write_text(
        '[build-system]\nrequires = ["setuptools"]\nbuild-backend = "setuptools.build_meta"\n'
        '[project]\nname = "probe"\nversion = "0"\n[project.scripts]\nhetsgd = "probe:main"\n'
        '[tool.setuptools]\npy-modules = ["probe"]\n')
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    _wheel(wheels, "wheelhouse_marker")
    done = subprocess.run(["bash", str(repo / "scripts" / "gpu_check.sh"), str(tmp_path / "out")],
                          env={"PATH": f"{fake}:/usr/bin:/bin", "HOME": str(tmp_path),
                               "WHEELHOUSE": str(wheels), "CUDA_VISIBLE_DEVICES": ""},
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and "cannot use it" in done.stderr  # no GPU this torch may use
    setup, = (tmp_path / "out" / "steps.txt").read_text().splitlines()
    assert setup.split()[::3] == ["setup", "ok"]
    where = subprocess.run([repo / ".venv" / "bin" / "python", "-c",
                            "import torch, wheelhouse_marker as m; print(torch.__file__, m.__file__)"],
                           capture_output=True, text=True, check=True).stdout.split()
    assert where == [torch.__file__, str(repo / ".venv" / PURELIB / "wheelhouse_marker.py")]


# the values the check's variables take where it runs its hetsgd commands
CHECK_VARIABLES = {"DATASET": "w8a", "SECONDS_PER_RUN": "12", "SHORT_S": "5",
                   "DIR": "/check", "CALIBRATION": "/check/calibration/profile.csv"}


def _hetsgd_commands() -> list[list[str]]:
    """Each ``hetsgd`` command of scripts/gpu_check.sh after its subcommand, its lines joined
    and its variables set as the check sets them."""
    text = (ROOT / "scripts" / "gpu_check.sh").read_text().replace("\\\n", " ")
    commands = []
    for line in text.splitlines():
        if '"$BIN/hetsgd" ' not in line or line.lstrip().startswith("#"):
            continue
        for name, value in CHECK_VARIABLES.items():
            line = line.replace(f"${name}", value)
        words = shlex.split(line.split('"$BIN/hetsgd" ', 1)[1].split(">", 1)[0])
        assert words[0] == "report" or "$" not in " ".join(words), words  # all set above
        commands.append(words)
    return commands


def _jobs(overrides: list[str]) -> list[list[str]]:
    """The jobs of a sweep's overrides: every combination of their comma-separated values."""
    swept = [o.split("=", 1) if "=" in o else [o, None] for o in overrides]
    choices = [[key] if values is None else [f"{key}={v}" for v in values.split(",")]
               for key, values in swept]
    return [list(job) for job in itertools.product(*choices)]


def test_every_run_the_gpu_check_starts_composes_and_its_baseline_is_the_gpu_alone() -> None:
    """The check runs once, on a lent machine, out of a few minutes: an override it misspells
    costs that run. Every job of every sweep it starts composes here, and the report's baseline
    selects the comparison's GPU-alone job."""
    commands = _hetsgd_commands()
    runs = [c[1:] for c in commands if c[0] == "run"]
    script = (ROOT / "scripts" / "gpu_check.sh").read_text()
    assert len(runs) == script.count('"$BIN/hetsgd" run') == 5  # comparison, replay, Hogwild,
    # graphs, local SGD
    composed = 0
    for overrides in runs:
        for job in _jobs([o for o in overrides if o != "-m"]):
            run_config(*job)
            composed += 1
    assert composed >= 8 + 1 + 3 + 4 + 3
    calibrate, = (c[1:] for c in commands if c[:2] == ["machine", "--calibrate"])
    run_config(*(o for o in calibrate if "=" in o))
    report, = (c for c in commands if c[0] == "report")
    baseline = dict(s.split("=", 1) for s in report[report.index("--baseline") + 1].split())
    alone = run_config("+method=gpu", "model=mlp_paper", "dataset=w8a")
    assert baseline == {"algo": alone.algo.name, "devices": alone.devices.name}


def test_optional_steps_are_skipped_in_priority_order_and_limits_cut_to_the_time_left(
        tmp_path: Path) -> None:
    """The check's own `fits` and `step`, on a made-up clock (in place of bash's SECONDS): once a step does
    not fit, every later one is skipped too, even one that would (the order is the priority);
    a step's limit never runs more than 30 s past the check's total."""
    script = (ROOT / "scripts" / "gpu_check.sh").read_text()
    # bash's SECONDS ticks at wall-clock second boundaries: the clock here is a plain variable
    functions = "\n".join(script[script.index(start):].split("\n}\n", 1)[0] + "\n}"
                          for start in ("step() {", "fits() {")).replace("SECONDS", "NOW")
    program = f"""
DIR={tmp_path}; TOTAL_S=100; FAILED=(); SKIPPING=
note() {{ echo "$*" >>"$DIR/steps.txt"; }}
timeout() {{ echo "limit $2" >>"$DIR/limits.txt"; }}
{functions}
NOW=0
step early 500 true
NOW=30
fits bench 70 && echo ran bench >>"$DIR/steps.txt"
NOW=40
fits calibrate 180 && echo ran calibrate >>"$DIR/steps.txt"
fits hogwild 10 && echo ran hogwild >>"$DIR/steps.txt"
exit 0
"""
    subprocess.run(["bash", "-c", program], check=True, timeout=30)
    steps = (tmp_path / "steps.txt").read_text()
    assert "calibrate: skipped, 60 s left of 100 s and it needs 180 s" in steps
    assert "hogwild: skipped, after calibrate" in steps
    # a step that needs all the time left (70 s at 30 s of 100) runs
    assert [line for line in steps.splitlines() if line.startswith("ran ")] == ["ran bench"]
    assert (tmp_path / "limits.txt").read_text().split() == ["limit", "130"]
    # past the total and its 30 s, a step still gets a limit (timeout 0 would mean none)
    late = tmp_path / "late"
    late.mkdir()
    subprocess.run(["bash", "-c", program.replace(str(tmp_path), str(late))
                    .replace("NOW=0\n", "NOW=200\n")], check=True, timeout=30)
    assert (late / "limits.txt").read_text().split() == ["limit", "1"]
