"""Range checks for the config schemas: every error names the field and what is allowed."""

from __future__ import annotations

import math
from typing import Any, TypeGuard

# The longest duration any setting may give (a budget, a timeout, a period): 30 days. A longer
# one is a typo, and inf or 1e300 would overflow the clocks of the libraries that take it
# (torch.distributed's timeouts, the standard library's waits) deep inside a run.
MAX_SECONDS = 30 * 24 * 3600.0


class ConfigError(ValueError):
    """A config value that is out of range or inconsistent; the message names the field."""


def require(ok: bool, field_name: str, allowed: str, value: Any) -> None:
    if not ok:
        raise ConfigError(f"{field_name}={value!r} is not allowed: {allowed}")


def one_of(field_name: str, value: Any, choices: tuple[str, ...]) -> None:
    require(value in choices, field_name, "choose one of " + ", ".join(choices), value)


def finite(value: Any) -> TypeGuard[float]:
    """A number other than inf and NaN: a comparison such as ``x > 0`` lets inf through."""
    return isinstance(value, (int, float)) and math.isfinite(value)


def finite_or_none(value: Any) -> float | None:
    """``value`` as a float where it reads as a finite number (``"2"`` and numpy scalars too),
    else None: for numbers read back from a run's files, which may hold anything."""
    try:
        number = float(value)
    except (TypeError, ValueError, OverflowError):  # OverflowError: an int past 1e308
        return None
    return number if math.isfinite(number) else None


def positive(field_name: str, value: Any, allowed: str = "a positive number", *,
             nullable: bool = False) -> None:
    """A positive, finite number (or None where ``nullable``; "or null" is said for it)."""
    require((nullable and value is None) or (finite(value) and value > 0), field_name,
            allowed + (", or null" if nullable else ""), value)


def seconds(field_name: str, value: Any, *, nullable: bool = False) -> None:
    """A duration: positive, finite and at most :data:`MAX_SECONDS`."""
    require((nullable and value is None) or (finite(value) and 0 < value <= MAX_SECONDS),
            field_name, f"a positive number of seconds, at most {MAX_SECONDS:,.0f} (30 days)"
            + (", or null" if nullable else ""), value)
