"""Find run directories under a path and load what they hold (the layout in docs/architecture.md).

Reports and figures are built from these files alone, so nothing is ever rerun. A run directory
is any folder holding ``summary.json``, ``config.yaml`` (the first file a run writes) or Hydra's
``.hydra/``; a sweep directory is any folder holding ``multirun.yaml``. A run directory without a
summary, or whose summary still says ``running`` while the process it names is gone, is a run
that was killed or crashed: it is listed as ``crashed``, never left out.

A run folder may be anyone's: each of its files is read only where it is a regular file (a FIFO
would wait for a writer forever, ``/dev/zero`` never ends: :func:`hetsgd.readback.open_regular`),
and its summary within ``MAX_SUMMARY_BYTES``. A file refused so reads as an unreadable one.
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pandas as pd

from hetsgd.config.checks import finite_or_none
from hetsgd.config.group_names import by_group_name, group_name
from hetsgd.data.files import reason
from hetsgd.errors import UserError
from hetsgd.liveness import is_alive, this_process
from hetsgd.outputs.run_directory import SNAPSHOTS, SUMMARY
from hetsgd.readback import load_yaml, open_regular, read_bounded

log = logging.getLogger(__name__)

MULTIRUN = "multirun.yaml"
#: The file whose exclusive creation claims a sweep folder for one sweep, naming its process
#: (:func:`hetsgd.outputs.sweep.claim_folder`).
CLAIM = ".hetsgd-claim.json"
#: A tuned sweep's search: the folder its trials run under, and the marker that makes that
#: folder one search's own (:func:`hetsgd.tuning.phases.claim`).
TRIALS_DIR = "tuning"
SEARCH_CLAIM = ".claimed"
CONFIG = "config.yaml"
HYDRA = ".hydra"
_MLFLOW_RUN_ID = re.compile(r"[0-9a-f]{32}")  # the folder of a run in MLflow's store
OVERRIDES = Path(HYDRA) / "overrides.yaml"
#: The status of a run whose process is still training or evaluating.
RUNNING = "running"
#: The status of a run directory without a summary, or whose summary still says running while
#: its process is gone.
CRASHED = "crashed"
#: The status of a completed run whose files the report or the figures cannot read.
UNUSABLE = "unusable"
#: The statuses a run's summary.json says it ended with, or is in.
STATUSES = ("completed", "diverged", "failed", "interrupted", CRASHED, RUNNING)
#: The most a run's summary.json may hold: the runner writes a few kilobytes (its lists of
#: classes and of devices included), so that this bounds only a file no run wrote.
MAX_SUMMARY_BYTES = 16 << 20

#: Overrides that do not make a run a variant of its setting: those saying which row, comparison
#: or seed it belongs to, and those that change only where or how it reports.
NOT_A_SETTING = frozenset({"algo", "dataset", "model", "devices", "seed", "progress",
                           "results_dir"})

#: Columns each CSV must have for the report and the plots to use it.
REQUIRED_COLUMNS: dict[str, tuple[str, ...]] = {
    "convergence": ("time_s", "epoch", "train_loss"),
    "utilization": ("time_s",),  # a simulated run has no host-wide CPU
    "workers": ("worker", "group"),
    "batches": ("time_s", "worker", "batch_size"),
}
#: Required columns that are not numbers.
TEXT_COLUMNS = frozenset({"group"})

_NUMBER = (int, float, type(None))
_TEXT = (str, type(None))
#: The types the runner writes the summary fields that reports read with; a summary holding
#: another (``"dataset": ["digits"]``, edited by hand or by another tool) is unreadable, so that
#: it costs its own run, never the report.
SUMMARY_TYPES: dict[str, tuple[type, ...]] = {
    "status": (str,), "error": _TEXT, "seed": (int, type(None)),
    **dict.fromkeys(("algo", "dataset", "model", "devices"), _TEXT),
    **dict.fromkeys(("emulated", "simulated"), (bool, type(None))),
    **dict.fromkeys(("time_s", "epochs", "examples", "updates", "examples_per_s"), _NUMBER),
}
#: Summary fields that map names (metrics, groups, target losses) to numbers.
NUMBER_MAPS = ("initial", "final", "updates_by_group", "update_share", "time_to_loss",
               "epochs_to_loss", "utilization")
#: Summary fields keyed by group, as paths: an earlier run's ``gpu`` group reads as ``accel``
#: (:mod:`hetsgd.config.group_names`).
GROUP_MAPS = (("mix",), ("updates_by_group",), ("update_share",), ("staleness", "by_group"),
              ("sync", "batch_share"), ("sync", "step_s"), ("local_sgd", "tau"),
              ("local_sgd", "aggregation_weight"), ("local_sgd", "step_s"))
_JSON_TYPES = {dict: "an object", list: "a list", str: "text", bool: "a boolean",
               type(None): "null"}


def _directory(path: Path) -> Path:
    path = Path(path)
    if not path.is_dir():
        raise UserError(f"{path} is not a directory")
    return path


def _natural(path: Path) -> list[tuple[int, int | str]]:
    """Sort key that puts job ``2_...`` before job ``10_...``."""
    return [(0, int(chunk)) if chunk.isdigit() else (1, chunk)
            for chunk in re.split(r"(\d+)", str(path)) if chunk]


def is_run_dir(path: Path) -> bool:
    """Whether ``path`` is a run directory: it holds ``summary.json``, ``config.yaml`` or
    ``.hydra/`` (a run that died early may hold only the last two). MLflow's store keeps a
    tracked run's summary.json and config.yaml in ``<experiment>/<run id>/artifacts/``
    (``logger=mlflow`` puts it under the results): a copy, not a run of its own."""
    path = Path(path)
    mlflow_copy = path.name == "artifacts" and _MLFLOW_RUN_ID.fullmatch(path.parent.name)
    return path.name != HYDRA and not mlflow_copy and (
        (path / SUMMARY).is_file() or (path / CONFIG).is_file() or (path / HYDRA).is_dir())


def find_runs(path: Path) -> list[Path]:
    """Every run directory at or below ``path``, in natural path order (one walk of the tree)."""
    root = _directory(path)
    found = [Path(folder) for folder, _, _ in os.walk(root) if is_run_dir(Path(folder))]
    return sorted(found, key=_natural)


def find_sweeps(path: Path) -> list[Path]:
    """Every sweep directory at or below ``path``, in natural path order."""
    return sorted((file.parent for file in _directory(path).rglob(MULTIRUN)), key=_natural)


def json_object(value: object) -> dict[str, Any]:
    """``value`` where it is a JSON object, else ``{}``: an entry of a summary read back (a
    run's ``local_sgd``, its ``mix``) may hold anything."""
    return value if isinstance(value, dict) else {}


def tau_text(summary: dict[str, Any]) -> str:
    """A local SGD run's tau per group as tables show it (``accel:8 cpu:1``); a dash for a run
    without one."""
    taus = json_object(json_object(summary.get("local_sgd")).get("tau"))
    return " ".join(f"{group}:{tau}" for group, tau in taus.items()) or "—"


def read_config(run_dir: Path) -> dict[str, Any]:
    """The run's ``config.yaml`` as data (never composed, nothing in it called): ``{}`` where it
    is missing, unreadable or not a mapping (:func:`index_dirs` says which, once)."""
    return _config(run_dir)[0]


def _config(run_dir: Path) -> tuple[dict[str, Any], str | None]:
    try:
        config = load_yaml(Path(run_dir) / CONFIG)
    except FileNotFoundError:
        return {}, None
    except (OSError, ValueError) as err:
        return {}, reason(err)
    return (config, None) if isinstance(config, dict) else ({}, "not a mapping")


def config_at(config: dict[str, Any], *keys: str) -> Any:
    """The value at ``keys`` (outermost first) of a config read as data (:func:`read_config`),
    such as ``budget.epochs``; None where there is none."""
    value: Any = config
    for key in keys:
        value = value.get(key) if isinstance(value, dict) else None
    return value


def config_number(run_dir: Path, *keys: str) -> float | None:
    """The finite number at ``keys`` in the run's ``config.yaml`` (:func:`config_at`); None
    where there is none."""
    return finite_or_none(config_at(read_config(run_dir), *keys))


def _identity_from_config(run_dir: Path) -> dict[str, Any]:
    """algo, dataset, model, devices and seed from the run's ``config.yaml`` (``{}`` if none),
    so that a run that left no summary is still listed under its name."""
    config = read_config(run_dir)
    identity: dict[str, Any] = {}
    for key in ("algo", "dataset", "model", "devices"):
        value = config.get(key)
        name = value.get("name") if isinstance(value, dict) else value
        if isinstance(name, str):
            identity[key] = name
    if isinstance(config.get("seed"), int):
        identity["seed"] = config["seed"]
    return identity


def _crashed(run_dir: Path, what: str) -> str:
    """Why a run reads as crashed, and how to make a result of what it left."""
    left = Path(run_dir) / SNAPSHOTS
    return what + (f"; `hetsgd recover {run_dir}` evaluates the snapshots it left"
                   if left.is_dir() else "")


def _wrong_type(summary: dict[str, Any]) -> str | None:
    """The first field of ``summary`` whose type the runner never writes, said; None if none."""
    def kind(value: object) -> str:
        return _JSON_TYPES.get(type(value), "a number")

    for key, types in SUMMARY_TYPES.items():
        if not isinstance(summary.get(key), types):
            return f"{key} is {kind(summary[key])}" if key in summary else f"no {key}"
    for key in NUMBER_MAPS:
        numbers = summary.get(key)
        if numbers is not None and not isinstance(numbers, dict):
            return f"{key} is {kind(numbers)}, not an object"
        wrong = next(((name, n) for name, n in (numbers or {}).items()
                      if not isinstance(n, _NUMBER)), None)
        if wrong is not None:
            return f"{key}.{wrong[0]} is {kind(wrong[1])}, not a number"
    return None


def summary_values(run_dir: Path) -> tuple[dict[str, Any], str | None]:
    """:func:`read_summary`, and why the file is unreadable (None when it is not)."""
    file = Path(run_dir) / SUMMARY
    if not file.exists() and not file.is_symlink():  # a link to nowhere is read, and named, below
        if _starting(Path(run_dir)):
            return {**_identity_from_config(run_dir), "status": RUNNING, "error": None}, None
        return {**_identity_from_config(run_dir), "status": CRASHED,
                "error": _crashed(run_dir, f"no {SUMMARY}: the run was killed or crashed "
                                           "before writing it")}, None
    try:
        summary = json.loads(read_bounded(file, MAX_SUMMARY_BYTES))
        why = _wrong_type(summary) if isinstance(summary, dict) else "not a JSON object"
    except (OSError, ValueError, RecursionError) as err:  # RecursionError: nested too deep
        why = reason(err)  # an OSError's own words: "not a regular file but a FIFO or pipe"
    if why is not None:
        return {**_identity_from_config(run_dir), "status": "failed",
                "error": f"unreadable {SUMMARY}: {why}"}, why
    _named_as_today(summary)
    if summary.get("status") == RUNNING and not is_alive(summary.get("coordinator")):
        summary.update(status=CRASHED, error=_crashed(
            run_dir, f"{SUMMARY} still says '{RUNNING}' but its process is gone: the run was "
                     "killed or crashed before it ended"))
    return summary, None


def _starting(run_dir: Path) -> bool:
    """Whether ``run_dir`` is the job a sweep is starting: Hydra has made its folder, its run has
    not yet written a summary, and it is the newest job of a sweep whose process (its claim)
    still runs, another than this one: the sweep itself knows that its job has ended. An
    earlier job without a summary did crash."""
    try:
        process = json.loads(read_bounded(run_dir.parent / CLAIM))
        if not is_alive(process) or process == this_process():
            return False
        jobs = [(int(m.group()), path.name) for path in run_dir.parent.iterdir()
                if path.is_dir() and (m := re.match(r"\d+", path.name))]
    except (OSError, ValueError):
        return False
    return bool(jobs) and max(jobs)[1] == run_dir.name


def _named_as_today(summary: dict[str, Any]) -> None:
    """``summary`` with what earlier versions named otherwise named as today: each of its maps
    keyed by group as today's mixes name the groups, and each group's ``label`` in ``mix``,
    which they called ``kind``."""
    for *path, key in GROUP_MAPS:
        holder: Any = summary
        for part in path:
            holder = holder.get(part) if isinstance(holder, dict) else None
        if isinstance(holder, dict) and isinstance(holder.get(key), dict):
            holder[key] = by_group_name(holder[key])
    mix = summary.get("mix")
    for group in mix.values() if isinstance(mix, dict) else ():
        if isinstance(group, dict) and "kind" in group and "label" not in group:
            group["label"] = group.pop("kind")


def _name_group_columns(frame: pd.DataFrame) -> pd.DataFrame:
    """``frame`` (a run's CSV) with its groups as today's mixes name them: the values of a
    ``group`` column and the ``updates_<group>`` columns."""
    if "group" in frame.columns:
        names = set(frame["group"].astype(str))
        frame["group"] = [group_name(str(g), names) for g in frame["group"]]
    groups = [c.removeprefix("updates_") for c in frame.columns if c.startswith("updates_")]
    return frame.rename(columns={f"updates_{g}": f"updates_{group_name(g, groups)}"
                                 for g in groups})


def read_summary(run_dir: Path) -> dict[str, Any]:
    """The run's summary. An unreadable file (not JSON, not an object, a field of a type the
    runner never writes) reads as a failed run that says why, and a missing one, or one that
    still says ``running`` while the process it names is gone, as a crashed run, so that one
    broken run is listed instead of hiding every other run of a report."""
    return summary_values(run_dir)[0]


def read_overrides(run_dir: Path) -> list[str]:
    """The Hydra overrides the run was started with (``[]`` when it has no ``.hydra/``)."""
    file = Path(run_dir) / OVERRIDES
    if not file.exists():
        return []
    try:
        overrides = load_yaml(file) or []
    except (OSError, ValueError) as err:
        raise UserError(f"cannot read {file}: {reason(err)}".splitlines()[0]) from err
    if not isinstance(overrides, list):
        raise UserError(f"cannot read {file}: expected a list of overrides")
    return [str(o) for o in overrides]


def override_key(override: str) -> str:
    """``+optim.lr=0.1`` -> ``optim.lr``."""
    return override.split("=", 1)[0].lstrip("+~")


def override_values(overrides: Iterable[str]) -> dict[str, str]:
    """``["+method=gpu", "seed=0"]`` -> ``{"method": "gpu", "seed": "0"}``: each override's key
    (:func:`override_key`) and value."""
    return {override_key(o): o.split("=", 1)[1] for o in overrides if "=" in o}


def settings(overrides: Iterable[str]) -> frozenset[str]:
    """The overrides that change what a run does beyond its row, comparison and seed (say
    ``optim.lr=0.05``)."""
    return frozenset(o for o in overrides if override_key(o) not in NOT_A_SETTING)


def flatten(mapping: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"optim": {"lr": ...}}`` as ``{"optim.lr": ...}``: nested keys dotted, as a CSV's
    column or an override names them."""
    flat: dict[str, Any] = {}
    for key, value in mapping.items():
        if isinstance(value, dict):
            flat.update(flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def index_dirs(run_dirs: Iterable[Path]) -> pd.DataFrame:
    """One row per run: ``summary.json`` flattened with dots, so that the columns are the fields
    of :class:`hetsgd.outputs.summary.RunSummary` and their keys (``final.train_loss``,
    ``update_share.cpu``, ``time_to_loss.0.3456``), plus ``run_dir`` (where the run is now),
    ``overrides`` (a tuple) and ``config`` (its config.yaml as data, :func:`read_config`, read
    once here for the comparisons). An unreadable summary, overrides or config file costs one
    warning line naming it; the run is listed as failed, or without its overrides or config."""
    rows = []
    for run_dir in run_dirs:
        row: dict[str, Any] = {key: None for key in ("algo", "dataset", "model", "devices", "seed")}
        row.update(status="unknown", error=None, emulated=False, simulated=False)
        summary, unreadable = summary_values(run_dir)
        if unreadable is not None:
            log.warning("unreadable %s: %s; the run is listed as failed",
                        Path(run_dir) / SUMMARY, unreadable)
        try:
            overrides = read_overrides(run_dir)
        except UserError as err:
            log.warning("%s; the run is listed without its overrides", err)
            overrides = []
        config, problem = _config(run_dir)
        if problem is not None:
            log.warning("unreadable %s: %s; the run is read without its config",
                        Path(run_dir) / CONFIG, problem)
        row.update(flatten(summary))
        row.update(run_dir=str(run_dir), overrides=tuple(overrides), config=config)
        row["emulated"], row["simulated"] = bool(row["emulated"]), bool(row["simulated"])
        rows.append(row)
    return pd.DataFrame(rows)


def index_runs(path: Path, leaving_out: Path | None = None) -> pd.DataFrame:
    """:func:`index_dirs` over every run directory under ``path`` (but those under
    ``leaving_out``, which are not read)."""
    left = None if leaving_out is None else Path(leaving_out).resolve()
    run_dirs = [d for d in find_runs(path) if left is None or not d.resolve().is_relative_to(left)]
    if not run_dirs:
        raise UserError(f"no runs under {path} (a run directory holds {SUMMARY}, {CONFIG} or "
                        f"{HYDRA}/)")
    return index_dirs(run_dirs)


def load_csv(run_dir: Path, name: str) -> pd.DataFrame | None:
    """``<run_dir>/<name>.csv`` (convergence, utilization, workers or batches), or None when the
    run did not write it (a failed run, a run without GPUs' batches...). A file that cannot be
    read (or is no regular file: :func:`open_regular`), or lacks a required column or has text
    in a numeric one, is a :class:`UserError` naming it."""
    file = Path(run_dir) / f"{name}.csv"
    if not file.exists():
        return None
    try:
        with open_regular(file) as handle:  # never a FIFO's writer waited for
            frame = pd.read_csv(handle)
    except pd.errors.EmptyDataError:  # written with no rows: nothing to draw or count
        return None
    except (OSError, ValueError) as err:
        raise UserError(f"cannot read {file}: {reason(err)}".splitlines()[0]) from err
    if frame.empty:  # a header alone: e.g. no utilization sample while a short run's workers ran
        return None
    missing = [c for c in REQUIRED_COLUMNS.get(name, ()) if c not in frame.columns]
    if missing:
        raise UserError(f"{file} lacks the column(s) {', '.join(missing)}")
    text = [c for c in REQUIRED_COLUMNS.get(name, ()) if c not in TEXT_COLUMNS
            and not pd.api.types.is_numeric_dtype(frame[c])]
    if text:
        raise UserError(f"{file} has values that are not numbers in {', '.join(text)}")
    return _name_group_columns(frame)

