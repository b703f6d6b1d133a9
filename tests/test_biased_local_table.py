"""scripts/biased_local_table.py: the reproduction's rows from its report, beside the paper;
another experiment's run in the folder is passed over, and a folder it cannot read is one line
on stderr and status 1."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from test_report import table_rows, write_overrides, write_run

from hetsgd.outputs.report import write_report

SCRIPT = Path(__file__).parents[1] / "scripts" / "biased_local_table.py"


def _table(folder: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SCRIPT), str(folder)], capture_output=True,
                          text=True, timeout=300)


def test_the_table_shows_the_reproductions_methods_and_refuses_other_folders(
        tmp_path: Path) -> None:
    jobs = [("sync", "sync"), ("local_sgd", "local_biased"), ("sync", "gpu")]  # gpu: not its own
    for job, (algo, method) in enumerate(jobs):
        for seed in (0, 1):
            run_dir = write_run(tmp_path / "sweeps" / "s" / f"{job}{seed}_{method}", algo=algo,
                                devices="paper_biased_local", seed=seed, speed=1 + job + seed / 5)
            write_overrides(run_dir, [f"+method={method}", f"seed={seed}"])
            (run_dir / "config.yaml").write_text("model: {name: mlp, hidden: [8]}\n")
    missing = _table(tmp_path)
    assert (missing.returncode, missing.stdout) == (1, "")
    assert missing.stderr.startswith(f"biased_local_table: cannot read {tmp_path}/report.csv "
                                     f"(`hetsgd report {tmp_path}` writes it): ")
    assert missing.stderr.count("\n") == 1

    write_report(tmp_path)
    shown = _table(tmp_path)
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.startswith("digits · mlp [8] on paper_biased_local (simulated)")
    rows = {row[0]: row for row in table_rows(shown.stdout) if row[0] != "method"}
    assert list(rows) == ["sync", "local_biased"]  # in the paper's order, gpu passed over
    assert rows["sync"][1] == rows["local_biased"][1] == "2/2"
    assert rows["local_biased"][-1] == "up to 32x faster than sync, nearly identical accuracy"

    other = tmp_path / "other"
    run_dir = write_run(other / "0_gpu", algo="sync", devices="gpu", seed=0)
    write_overrides(run_dir, ["+method=gpu", "seed=0"])
    write_report(other)
    refused = _table(other)
    assert (refused.returncode, refused.stdout) == (1, "")
    assert refused.stderr == (f"biased_local_table: no run of "
                              f"scripts/reproduce_biased_local_sim.sh in {other}/report.csv: no "
                              "row has +method= one of sync, fast_alone, local_balanced, "
                              "local_unbalanced, local_biased\n")
