"""The keys a sweep varies, which name its job folders (``3_+method=gpu,seed=1``): the overrides
every job shares would only repeat in each name and hide the ones that tell the jobs apart.

A sweep's overrides are those of its command line and its sweeper's ``params`` (an experiment's),
both in the ``multirun.yaml`` Hydra writes into the sweep folder before any job starts, where a
job can read them wherever its launcher runs it; a key is swept where one of them gives it several
values (``seed=0,1``, ``seed=range(3)``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path

from hydra.core.override_parser.overrides_parser import OverridesParser

from hetsgd.readback import load_yaml

MULTIRUN = "multirun.yaml"


def sweep_overrides(sweep_dir: Path) -> list[str]:
    """The overrides a sweep's ``multirun.yaml`` records, its sweeper's params included (``[]``
    without the file)."""
    file = Path(sweep_dir) / MULTIRUN
    if not file.is_file():
        return []
    hydra = (load_yaml(file) or {}).get("hydra") or {}
    listed = [str(o) for o in (hydra.get("overrides") or {}).get("task") or []]
    params = (hydra.get("sweeper") or {}).get("params") or {}
    return listed + [f"{key}={value}" for key, value in params.items()]


def swept_keys(overrides: Iterable[str]) -> frozenset[str]:
    """The keys (``method`` for ``+method=a,b``) that ``overrides`` give several values."""
    parsed = OverridesParser.create().parse_overrides(list(overrides))
    return frozenset(o.key_or_group for o in parsed if o.is_sweep_override())


def swept_name(job_overrides: Sequence[str], swept: frozenset[str]) -> str:
    """A job's overrides of the ``swept`` keys, as the job has them and in its order, joined by
    commas: ``+method=gpu,seed=0``."""
    parser = OverridesParser.create()
    return ",".join(o for o in job_overrides if parser.parse_override(o).key_or_group in swept)
