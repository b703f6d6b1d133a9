"""The file formats figures are saved in, checked without importing matplotlib: a sweep's
callback checks its formats when Hydra builds it, at the start of every run."""

from __future__ import annotations

from collections.abc import Iterable

from hetsgd.errors import UserError

FORMATS = ("png", "svg", "pdf")


def check_formats(formats: Iterable[str]) -> tuple[str, ...]:
    chosen = tuple(dict.fromkeys(f.strip().lower().lstrip(".") for f in formats))  # each once
    bad = [f for f in chosen if f not in FORMATS]
    if bad or not chosen:
        raise UserError(f"unknown figure format {bad[0] if bad else ''!r}: "
                        f"choose from {', '.join(FORMATS)}")
    return chosen
