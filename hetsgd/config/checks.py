"""Range checks for the config schemas: every error names the field and what is allowed."""

from __future__ import annotations

from typing import Any


class ConfigError(ValueError):
    """A config value that is out of range or inconsistent; the message names the field."""


def require(ok: bool, field_name: str, allowed: str, value: Any) -> None:
    if not ok:
        raise ConfigError(f"{field_name}={value!r} is not allowed: {allowed}")


def one_of(field_name: str, value: Any, choices: tuple[str, ...]) -> None:
    require(value in choices, field_name, "choose one of " + ", ".join(choices), value)
