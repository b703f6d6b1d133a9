"""Resources a long sweep holds, job by job: does what each job costs return to a constant?

Runs ``hetsgd run -m algo=hogwild 'seed=range(N)' budget.seconds=1 budget.epochs=null
progress=false`` under a limit on open files (``ulimit -n``), in fresh results and data folders,
and polls the sweep process's /proc and the sweep's job folders. When a job's ``summary.json``
leaves ``running`` it writes one row: the job's outcome, its wall time (from the previous job's
end), and the sweep process's open fds, RSS, threads, child processes and the entries of
/dev/shm at that moment. A sweep that leaks grows these with the job number; a flat one does not.

    .venv/bin/python scripts/sweep_resources.py --jobs 300 --nofile 256 --csv sweep.csv
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

COLUMNS = ("job", "status", "wall_s", "fds", "rss_mb", "threads", "children", "shm")
POLL_S = 0.2


def _status_field(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


def _children(pid: int) -> int:
    """Every process below ``pid`` (workers, the forkserver, resource trackers)."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parents[int(entry.name)] = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
    below: set[int] = set()
    frontier = {pid}
    while frontier:
        frontier = {child for child, parent in parents.items() if parent in frontier} - below
        below |= frontier
    return len(below)


def sample(pid: int) -> dict[str, float]:
    """The sweep process's resources now."""
    return {"fds": len(os.listdir(f"/proc/{pid}/fd")),
            "rss_mb": round(_status_field(pid, "VmRSS") / 1024, 1),
            "threads": _status_field(pid, "Threads"),
            "children": _children(pid),
            "shm": len(os.listdir("/dev/shm"))}


def _job_status(job_dir: Path) -> str | None:
    """The job's status once it has ended; None while it runs or before its summary exists."""
    try:
        status = json.loads((job_dir / "summary.json").read_text()).get("status")
    except (OSError, ValueError):
        return None
    return None if status in (None, "running") else str(status)


def _pymp() -> set[str]:
    return {name for name in os.listdir(tempfile.gettempdir()) if name.startswith("pymp-")}


def _limit_files(nofile: int) -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=300)
    parser.add_argument("--nofile", type=int, default=256, help="the sweep's ulimit -n")
    parser.add_argument("--csv", type=Path, required=True, help="the per-job table")
    parser.add_argument("--hetsgd", default=str(Path(sys.executable).with_name("hetsgd")))
    args = parser.parse_args()

    pymp_before = _pymp()
    work = Path(tempfile.mkdtemp(prefix="hetsgd-sweep-"))
    sweep_dir = work / "sweep"
    env = {**os.environ, "HETSGD_RESULTS": str(work / "results"), "HETSGD_DATA": str(work / "data")}
    command = [args.hetsgd, "run", "-m", "algo=hogwild", f"seed=range({args.jobs})",
               "budget.seconds=1", "budget.epochs=null", "progress=false",
               f"hydra.sweep.dir={sweep_dir}"]
    log = (work / "sweep.log").open("w")
    started = time.monotonic()
    sweep = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT,
                             preexec_fn=lambda: _limit_files(args.nofile))
    ended: dict[str, dict[str, object]] = {}
    last_end = started
    with args.csv.open("w", newline="") as out:
        writer = csv.DictWriter(out, COLUMNS)
        writer.writeheader()
        while True:
            running = sweep.poll() is None
            jobs = sorted((d for d in sweep_dir.glob("*_*") if d.is_dir() and d.name not in ended),
                          key=lambda d: int(d.name.split("_", 1)[0]))
            for job_dir in jobs:
                status = _job_status(job_dir)
                if status is None:
                    continue
                now = time.monotonic()
                try:
                    row = {"job": int(job_dir.name.split("_", 1)[0]), "status": status,
                           "wall_s": round(now - last_end, 2), **sample(sweep.pid)}
                except (OSError, KeyError):  # the sweep process has just ended
                    row = {"job": int(job_dir.name.split("_", 1)[0]), "status": status,
                           "wall_s": round(now - last_end, 2)}
                last_end = now
                ended[job_dir.name] = row
                writer.writerow(row)
                out.flush()
            if not running:
                break
            time.sleep(POLL_S)
    log.close()
    total = time.monotonic() - started
    completed = sum(1 for row in ended.values() if row["status"] == "completed")
    print(f"exit code {sweep.returncode}; {completed}/{args.jobs} jobs completed, "
          f"{len(ended)} ended, in {total:.0f} s; per-job table {args.csv}; log {work / 'sweep.log'}")
    print("report.md:", (sweep_dir / "report.md").is_file(), " summary.csv:",
          (sweep_dir / "summary.csv").is_file())
    print("multiprocessing pymp-* folders left:", len(_pymp() - pymp_before))
    shutil.rmtree(work / "data", ignore_errors=True)
    return 0 if completed == args.jobs and sweep.returncode == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
