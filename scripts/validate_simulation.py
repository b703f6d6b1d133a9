"""Real against simulated on this machine (hetsgd.runs.validate): calibrate, run every case for
real and on the virtual clock, print the table of medians and their ratios.

    .venv/bin/python scripts/validate_simulation.py            # 5 cases x 3 seeds, 9 min or more
    .venv/bin/python scripts/validate_simulation.py --seeds 0 --seconds 4

Exit status 1 when a ratio is outside 1 +- --tolerance (0.15). Run it on a quiet machine: the
real runs' speed is what the simulation is compared with. Each real run is followed by a second
calibration (the 9 min were measured before it was added); a real run whose two calibrations
differ by more than --drift is run again, and after --attempts such runs the exit status is 2.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from hetsgd.runs.validate import CASES, UnsteadyMachine, table, validate


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--seconds", type=float, default=4.0, help="each run's time budget")
    parser.add_argument("--dataset", default="digits")
    parser.add_argument("--model", default="mlp")
    parser.add_argument("--target-loss", type=float, default=0.03,
                        help="the training loss whose time to reach is compared, where a case "
                        "has none of its own (the table names each)")
    parser.add_argument("--calibration-seconds", type=float, default=1.0,
                        help="each batch size's time in the calibrations")
    parser.add_argument("--tolerance", type=float, default=0.15)
    parser.add_argument("--drift", type=float, default=1.3,
                        help="the most a group's step time may move between the calibrations "
                        "before and after a real run, or it is measured again")
    parser.add_argument("--attempts", type=int, default=3)
    parser.add_argument("--only", default="", help="the cases whose name contains this text")
    parser.add_argument("--out", type=Path, default=Path("results/validation"))
    args = parser.parse_args()
    # lr 0.01: the loss falls over seconds, not within the first snapshot; snapshots by time
    # only, so that the real coordinator copies and writes a few a second, not one a tick
    common = (f"dataset={args.dataset}", f"model={args.model}", "optim.lr=0.01",
              "budget.epochs=null", f"budget.seconds={args.seconds}", "eval.every_s=0.2",
              "eval.every_epochs=null", "progress=false")
    started = time.perf_counter()
    cases = [case for case in CASES if args.only in case.name]
    if not cases:
        parser.error(f"no case's name contains {args.only!r}: "
                     f"{', '.join(case.name for case in CASES)}")
    try:
        comparisons = validate(cases, common, args.seeds, args.target_loss, args.out,
                               args.calibration_seconds,
                               progress=lambda line: print(
                                   f"[{time.perf_counter() - started:6.0f} s] {line}",
                                   file=sys.stderr, flush=True),
                               drift=args.drift, attempts=args.attempts)
    except UnsteadyMachine as exc:
        print(f"validate_simulation: error: {exc}", file=sys.stderr)
        return 2
    print(f"{args.dataset}, {args.model}, {args.seconds:g} s a run, seeds "
          f"{' '.join(map(str, args.seeds))}, time to training loss {args.target_loss:g} "
          "unless a case has its own; "
          f"{time.perf_counter() - started:.0f} s in all\n")
    print(table(comparisons))
    outside = [c for c in comparisons if c.ratio is None or abs(c.ratio - 1) > args.tolerance]
    for c in outside:
        print(f"outside 1 +- {args.tolerance:g}: {c.case}, {c.metric}", file=sys.stderr)
    return 1 if outside else 0


if __name__ == "__main__":
    sys.exit(main())
