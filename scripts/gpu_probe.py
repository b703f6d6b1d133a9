"""What else the machine did while the GPU check's runs trained, and Hogwild's warmed-up rates.

``probe OUT.csv [--interval S]``: until stopped (SIGTERM or Ctrl-C), one row per sample: the
CPUs' steal and the kernel's CPU pressure (``/proc/pressure/cpu``, some avg10), every hetsgd
process's CPU % and context switches (voluntary, involuntary) since the last sample, and the
three busiest other processes. A contended CPU explains a slow worker; this says whether it was.

``rates SWEEP_DIR``: each run's updates per second after a warm-up (``--warmup`` s, default 1),
from its ``convergence.csv``: a run's first second (processes starting, caches filling) is not
its rate.
"""

from __future__ import annotations

import argparse
import csv
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


def _ours(proc: psutil.Process) -> bool:
    try:
        return any("hetsgd" in part for part in proc.cmdline())
    except (psutil.Error, OSError):
        return False


def probe(out: Path, interval: float) -> None:
    """Sample until SIGTERM (a row per sample, flushed, so a killed probe loses nothing)."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    me = psutil.Process().pid
    last: dict[int, tuple[float, int, int]] = {}
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
            rows = []
            for proc in psutil.process_iter(["pid", "name"]):
                if proc.pid == me:
                    continue
                try:
                    cpu = proc.cpu_times()
                    switches = proc.num_ctx_switches()
                except (psutil.Error, OSError):
                    continue
                seconds = cpu.user + cpu.system
                before = last.get(proc.pid)
                last[proc.pid] = (seconds, switches.voluntary, switches.involuntary)
                if before is None:
                    continue
                rows.append([proc.pid, proc.info["name"], 100 * (seconds - before[0]) / interval,
                             switches.voluntary - before[1], switches.involuntary - before[2],
                             _ours(proc)])
            others = sorted((r for r in rows if not r[5]), key=lambda r: -r[2])[:TOP_OTHERS]
            at = round(time.monotonic() - started, 3)
            for row in [r for r in rows if r[5]] + others:
                writer.writerow([at, round(steal, 2), _pressure(), *row])
            file.flush()


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


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m scripts.gpu_probe")
    commands = parser.add_subparsers(dest="command", required=True)
    sampling = commands.add_parser("probe")
    sampling.add_argument("out", type=Path)
    sampling.add_argument("--interval", type=float, default=0.5)
    rating = commands.add_parser("rates")
    rating.add_argument("sweep", type=Path)
    rating.add_argument("--warmup", type=float, default=1.0)
    args = parser.parse_args()
    if args.command == "probe":
        probe(args.out, args.interval)
    else:
        if not args.sweep.is_dir():
            print(f"gpu_probe: no folder {args.sweep}", file=sys.stderr)
            return 2
        rates(args.sweep, args.warmup).to_csv(sys.stdout, index=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
