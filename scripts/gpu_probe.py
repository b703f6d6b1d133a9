"""What else the machine did while the GPU check's runs trained, and Hogwild's warmed-up rates.

``probe OUT.csv [--interval S]``: until stopped (SIGTERM or Ctrl-C), one row per sample: the
CPUs' steal and the kernel's CPU pressure (``/proc/pressure/cpu``, some avg10), every hetsgd
process's CPU % and context switches (voluntary, involuntary) since the last sample, and the
three busiest other processes. A contended CPU explains a slow worker; this says whether it was.

``rates SWEEP_DIR``: each run's updates per second after a warm-up (``--warmup`` s, default 1),
from its ``convergence.csv``: a run's first second (processes starting, caches filling) is not
its rate.

``replayed REPLAY_DIR SWEEP_DIR``: what the calibrated simulation models. For each real run in
the sweep with the replay's algorithm and device mix, each group's updates per second simulated
(per virtual second) over real, beside the real run's CPU share (``contention`` in its
summary): a ratio far from 1 where the share is low is the machine's contention, not the model.
"""

from __future__ import annotations

import argparse
import csv
import json
import signal
import sys
import time
from pathlib import Path

import pandas as pd
import psutil

TOP_OTHERS = 3


def _pressure() -> float | None:
    """``some avg10`` of /proc/pressure/cpu (None where the kernel has no PSI)."""
    try:
        first = Path("/proc/pressure/cpu").read_text().splitlines()[0]
    except (OSError, IndexError):
        return None
    fields = dict(item.split("=") for item in first.split()[1:])
    return float(fields["avg10"])


def ours(proc: psutil.Process) -> bool:
    """A process of hetsgd's runs (its command, its workers, the forkserver it preloads), not
    the check's own shell script or this probe, whose paths may hold the word too."""
    try:
        cmdline = proc.cmdline()
    except (psutil.Error, OSError):
        return False
    own = any(part.endswith(".sh") or "gpu_probe" in part for part in cmdline)
    return not own and any("hetsgd" in part for part in cmdline)


def probe(out: Path, interval: float) -> None:
    """Sample until SIGTERM (a row per sample, flushed, so a killed probe loses nothing)."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    last: dict[int, tuple[float, float, int, int]] = {}
    steal_before = psutil.cpu_times()
    with out.open("w", newline="") as file:
        writer = csv.writer(file)
        writer.writerow(["time_s", "steal_percent", "pressure_avg10", "pid", "name", "cpu_percent",
                         "voluntary_switches", "involuntary_switches", "ours"])
        started = time.monotonic()
        while True:
            time.sleep(interval)
            now = psutil.cpu_times()
            total = sum(now) - sum(steal_before)
            steal = 100 * (getattr(now, "steal", 0.0) - getattr(steal_before, "steal", 0.0)) / (
                total or 1.0)
            steal_before = now
            rows = processes(last)
            others = sorted((r for r in rows if not r[5]), key=lambda r: -r[2])[:TOP_OTHERS]
            at = round(time.monotonic() - started, 3)
            for row in [r for r in rows if r[5]] + others:
                writer.writerow([at, round(steal, 2), _pressure(), *row])
            file.flush()


def processes(last: dict[int, tuple[float, float, int, int]]) -> list[list]:
    """Every other process seen at the last sample too: pid, name, its CPU % and context
    switches since, whether it is hetsgd's. Its CPU % is over the time between its own two
    readings, not the nominal interval, which the scan of every process itself lengthens.
    ``last`` (pid: when, CPU seconds, switches) is updated."""
    me, rows = psutil.Process().pid, []
    for proc in psutil.process_iter(["pid", "name"]):
        if proc.pid == me:
            continue
        try:
            cpu = proc.cpu_times()
            switches = proc.num_ctx_switches()
        except (psutil.Error, OSError):
            continue
        at, seconds = time.monotonic(), cpu.user + cpu.system
        before = last.get(proc.pid)
        last[proc.pid] = (at, seconds, switches.voluntary, switches.involuntary)
        if before is None or at <= before[0]:
            continue
        rows.append([proc.pid, proc.info["name"], 100 * (seconds - before[1]) / (at - before[0]),
                     switches.voluntary - before[2], switches.involuntary - before[3],
                     ours(proc)])
    return rows


def rates(sweep: Path, warmup: float) -> pd.DataFrame:
    """Per run folder under ``sweep`` with a convergence.csv: its updates per second after
    ``warmup`` seconds (NaN for a run shorter than that)."""
    rows = []
    for conv_file in sorted(sweep.rglob("convergence.csv")):
        conv = pd.read_csv(conv_file)
        warm = conv[conv["time_s"] >= warmup]
        rate = float("nan")
        if len(warm) >= 2 and warm["time_s"].iloc[-1] > warm["time_s"].iloc[0]:
            rate = ((warm["updates"].iloc[-1] - warm["updates"].iloc[0])
                    / (warm["time_s"].iloc[-1] - warm["time_s"].iloc[0]))
        rows.append({"run": str(conv_file.parent.relative_to(sweep)),
                     "updates_per_s_after_warmup": rate})
    return pd.DataFrame(rows)


def _summaries(folder: Path) -> list[dict]:
    """The summaries of the runs under ``folder`` (data: read, never run)."""
    return [json.loads(file.read_text()) for file in sorted(folder.rglob("summary.json"))]


def _rates(summary: dict) -> dict[str, float]:
    """Each group's updates per second of the run's (real or virtual) training time."""
    seconds = summary.get("time_s") or float("nan")
    return {group: n / seconds for group, n in (summary.get("updates_by_group") or {}).items()}


def replayed(replay: Path, sweep: Path) -> pd.DataFrame:
    """Simulated over real updates per second, per group and real run (see the module's text)."""
    simulated = [s for s in _summaries(replay) if s.get("simulated")]
    if len(simulated) != 1:
        raise SystemExit(f"gpu_probe: {replay} holds {len(simulated)} simulated runs, not one")
    sim, = simulated
    rows = []
    for real in _summaries(sweep):
        if real.get("simulated") or (real.get("algo"), real.get("devices")) != (
                sim["algo"], sim["devices"]):
            continue
        contention = real.get("contention") or {}
        shares = contention.get("by_group") or {}
        sim_rates = _rates(sim)
        for group, rate in _rates(real).items():
            rows.append({"run": real.get("run_dir"), "seed": real.get("seed"), "group": group,
                         "real_updates_per_s": rate,
                         "sim_updates_per_virtual_s": sim_rates.get(group, float("nan")),
                         "sim_over_real": sim_rates.get(group, float("nan")) / rate if rate
                         else float("nan"),
                         "workers_cpu_share": contention.get("workers_cpu_share"),
                         "group_cpu_share": shares.get(group)})
    return pd.DataFrame(rows)


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m scripts.gpu_probe")
    commands = parser.add_subparsers(dest="command", required=True)
    sampling = commands.add_parser("probe")
    sampling.add_argument("out", type=Path)
    sampling.add_argument("--interval", type=float, default=0.5)
    rating = commands.add_parser("rates")
    rating.add_argument("sweep", type=Path)
    rating.add_argument("--warmup", type=float, default=1.0)
    replaying = commands.add_parser("replayed")
    replaying.add_argument("replay", type=Path)
    replaying.add_argument("sweep", type=Path)
    args = parser.parse_args()
    if args.command == "probe":
        probe(args.out, args.interval)
        return 0
    folders = [args.sweep] + ([args.replay] if args.command == "replayed" else [])
    if missing := [str(f) for f in folders if not f.is_dir()]:
        print(f"gpu_probe: no folder {', '.join(missing)}", file=sys.stderr)
        return 2
    table = (rates(args.sweep, args.warmup) if args.command == "rates"
             else replayed(args.replay, args.sweep))
    table.to_csv(sys.stdout, index=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
