"""`make bench`: hetsgd's speed as ratios measured side by side in one run.

The entry point: the sections by key, each measured in turn and written as it ends; what each
measures and its goal: scripts/bench/__init__.py."""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict
from datetime import datetime
from pathlib import Path
from typing import Any

from rich.console import Console

from hetsgd.outputs.run_directory import environment
from scripts.bench.accel import bench_accel
from scripts.bench.hogwild import bench_hogwild
from scripts.bench.jobs import Jobs, choose_data
from scripts.bench.load import OtherLoad
from scripts.bench.memory import bench_memory
from scripts.bench.overhead import bench_overhead
from scripts.bench.sampler import bench_sampler
from scripts.bench.section import Section
from scripts.bench.step import bench_loop, bench_step
from scripts.bench.targets import bench_time_to_target
from scripts.bench.virtual import bench_virtual_engine

console = Console(width=None if sys.stdout.isatty() else 132)

Bench = Callable[[Jobs, float], Section]
BENCHES: dict[str, tuple[Bench, str]] = {
    "a": (bench_step, "worker step vs plain loop"), "b": (bench_loop, "loop overhead"),
    "c": (bench_hogwild, "Hogwild scaling"), "d": (bench_memory, "memory"),
    "e": (bench_time_to_target, "time to target"), "f": (bench_sampler, "sampler overhead"),
    "g": (bench_virtual_engine, "virtual engine overhead"),
    "h": (bench_overhead, "the cost around a run"),
    "i": (bench_accel, "the accelerator step vs a textbook loop")}
QUICK = "abcdg"  # `make bench-quick`: the sections with goals
QUICK_SECONDS = 2.0


def _measure(key: str, bench: Bench, name: str, jobs: Jobs, seconds: float) -> Section:
    """One measurement; a failure is recorded in its section and the bench goes on."""
    console.print(f"[bold]bench:[/bold] {name} ...")
    started = time.perf_counter()
    with OtherLoad() as load:
        try:
            section = bench(jobs, seconds)
        except Exception as exc:  # noqa: BLE001 - report it with the others, do not lose the rest
            section = Section(name, "", ["error"],
                              error=" ".join(f"{type(exc).__name__}: {exc}".split()))
    section.key = key
    others, steal = load.shares()
    section.load = (f"Meanwhile other processes used {others:.0%} of the CPUs"
                    + (f" and the hypervisor stole {steal:.0%}" if steal >= 0.005 else "")
                    + ("; a busy machine makes these ratios unreliable." if others + steal > 0.1
                       else "."))
    section.data.update(bench_seconds=time.perf_counter() - started, others_cpu_share=others,
                        steal_share=steal)
    return section


def write(out: Path, header: dict[str, Any], sections: list[Section]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    report = dict(header, sections={s.key: asdict(s) for s in sections})
    (out / "bench.json").write_text(json.dumps(report, indent=2, default=str) + "\n")
    machine = header["machine"]
    intro = [f"# hetsgd bench, {header['time']}", "",
             f"Machine: {machine['cpu_model']}, {machine['cores']} usable cores, "
             f"GPUs: {', '.join(machine['gpus']) or 'none'}; torch {machine['torch']}. "
             f"Data: {header['data']}; {header['seconds']} s per training run. "
             "Ratios compare runs made side by side in this one bench; absolute numbers are "
             "in bench.json.", "", ""]
    (out / "bench.md").write_text("\n".join(intro) + "\n".join(s.markdown() for s in sections))


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m scripts.bench",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float,
                        default=float(os.environ.get("HETSGD_BENCH_SECONDS", 5)),
                        help="time budget of each training run (default 5, "
                             "or $HETSGD_BENCH_SECONDS)")
    parser.add_argument("--out", type=Path, default=None,
                        help="output folder (default $HETSGD_RESULTS/bench/<time>)")
    parser.add_argument("--only", default="".join(BENCHES),
                        help="the sections to run, by key (e.g. --only d; default: all)")
    parser.add_argument("--quick", action="store_true",
                        help=f"sections {QUICK} with 2 s runs (`make bench-quick`)")
    args = parser.parse_args()
    if args.quick:
        args.only, args.seconds = QUICK, QUICK_SECONDS
    if unknown := set(args.only) - set(BENCHES):
        parser.error(f"--only: no section {', '.join(sorted(unknown))}")
    stamp = datetime.now().strftime("%Y-%m-%d_%H-%M-%S")
    out = args.out or Path(os.environ.get("HETSGD_RESULTS", "results")) / "bench" / stamp
    started = time.perf_counter()
    header: dict[str, Any] = {"time": stamp, "machine": environment(), "seconds": args.seconds}
    sections: list[Section] = []
    with tempfile.TemporaryDirectory(prefix="hetsgd-bench-") as tmp:
        data, header["data"] = choose_data(Path(tmp))
        os.environ["HETSGD_RESULTS"] = str(Path(tmp) / "results")
        jobs = Jobs(Path(tmp) / "runs", data)
        for key, (bench, name) in BENCHES.items():
            if key not in args.only:
                continue
            sections.append(_measure(key, bench, name, jobs, args.seconds))
            console.print(sections[-1].table())
            console.print()
            header["total_s"] = time.perf_counter() - started
            write(out, header, sections)  # after each: a bench cut short keeps what it measured
    machine = header["machine"]
    console.print(f"{machine['cpu_model']}, {machine['cores']} cores; data: {header['data']}; "
                  f"{header['total_s']:.0f} s in all. Written: {out}/bench.json, bench.md")
    return 1 if any(s.error for s in sections) else 0


if __name__ == "__main__":  # spawned workers import the sections' modules, never this one
    sys.exit(main())
