"""`hetsgd runs`' table (hetsgd.outputs.listing): how a run's row reads."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

from rich.console import Console

from hetsgd.outputs.listing import UNLIMITED, runs_table, select_runs


def _summary(name: str, time_s: float | None, simulated: bool) -> dict[str, object]:
    return {"status": "completed", "error": None, "seed": 0, "algo": "hogbatch",
            "dataset": "digits", "model": name, "devices": "paper", "emulated": False,
            "simulated": simulated, "time_s": time_s, "final": {"train_loss": 0.5}}


def test_times_keep_three_digits_and_say_when_they_are_virtual(tmp_path: Path) -> None:
    """A simulated run trains for a few hundredths of a virtual second: shown as 0.0 it read as
    a run that did not train, and as a measured time."""
    runs = {"sim": (0.0213, True), "real": (2.5, False), "long": (12345.6, False),
            "none": (None, True)}
    for name, (time_s, simulated) in runs.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "summary.json").write_text(json.dumps(_summary(name, time_s,
                                                                          simulated)))
    out = io.StringIO()
    Console(file=out, width=UNLIMITED).print(runs_table(select_runs(tmp_path, {}), tmp_path))
    rows = [re.split(r"\s{2,}", line.strip()) for line in out.getvalue().splitlines()]
    times = {row[0]: row[-1] for row in rows if row[0] in runs}  # cells 2 spaces apart
    assert times == {"sim": "0.0213 (virtual)", "real": "2.5", "long": "12346", "none": "—"}
