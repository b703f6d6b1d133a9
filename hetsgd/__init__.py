"""hetsgd: train one model on the CPUs and GPUs of a server together, and measure it.

From Python: ``hetsgd.run(*overrides)``, ``hetsgd.sweep(*overrides)`` and
``hetsgd.load(run_dir)`` (:mod:`hetsgd.api`), loaded on first use, so that ``import hetsgd``
stays as light as the package's own submodules need.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"
__all__ = ["RunResult", "SweepResult", "load", "run", "sweep"]

if TYPE_CHECKING:
    from hetsgd.api import RunResult, SweepResult, load, run, sweep


def __getattr__(name: str) -> Any:
    if name in __all__:
        from hetsgd import api

        return getattr(api, name)
    raise AttributeError(f"module 'hetsgd' has no attribute {name!r}")
