"""A tracker's failure: said on one line, and remembered for the rest of a sweep, whose later
jobs it would fail alike (and stall, a silent server by its timeout each): one warning per
sweep. Both the live feed (:mod:`.live`) and the final log (:func:`~.track`) go through it."""

from __future__ import annotations

from pathlib import Path

#: The trackers that failed in a sweep, by (sweep folder, tracker): each is tried once per sweep.
_failed: set[tuple[Path, str]] = set()


def cause(exc: BaseException) -> str:
    """The exception on one line, with the install that a missing tracker package needs."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    said = f"{type(exc).__name__}: {' '.join(lines)[:500]}" if lines else type(exc).__name__
    return said + (" (pip install 'hetsgd[tracking]')" if isinstance(exc, ImportError) else "")


def _key(sweep: Path, tracker: str) -> tuple[Path, str]:
    """One key per sweep folder however a caller spells its path (relative, through a link)."""
    return sweep.resolve(), tracker


def tried(sweep: Path | None, tracker: str) -> bool:
    """Whether ``tracker`` is to log this run: not once it failed in the run's sweep."""
    return sweep is None or _key(sweep, tracker) not in _failed


def drop(sweep: Path | None, tracker: str) -> str:
    """Leave ``tracker`` out for the rest of ``sweep`` (none: a run of its own); what the
    warning adds."""
    if sweep is None:
        return ""
    _failed.add(_key(sweep, tracker))
    return f"; {tracker} is left out for the rest of the sweep"
