"""The nearest valid word after a typo (``budget.second`` -> ``budget.seconds``), among words
given: no composition here, so that composing a config (:mod:`hetsgd.config.compose`) can name
the key an unknown one was meant to be, and :mod:`hetsgd.config.keys` can too for the keys of the
configs it composes."""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Sequence

from omegaconf import DictConfig

from hetsgd.config.hydra_private import present_child


def dotted_keys(node: DictConfig, prefix: str = "") -> list[str]:
    """Every leaf key of ``node`` as an override names it (``budget.seconds``), unresolved."""
    keys = []
    for key in node.keys():
        path = f"{prefix}{key!s}"
        if (child := present_child(node, str(key))) is not None:
            keys += dotted_keys(child, f"{path}.")
        else:
            keys.append(path)
    return keys


def nearest(word: str, candidates: Iterable[str], cutoff: float = 0.6) -> str | None:
    """The candidate closest to ``word`` (difflib's ratio, at least ``cutoff``), if any."""
    close = difflib.get_close_matches(word, list(candidates), n=1, cutoff=cutoff)
    return close[0] if close else None


def nearest_key(key: str, keys: Iterable[str]) -> str | None:
    """The key nearest ``key``: one beside it (``budget.seconds`` for ``budget.second``), by its
    last part, else one whose whole path is nearly the same (``budget.seconds`` for
    ``budgt.seconds``). The whole path alone would find ``algo.name`` for ``algo.tauu``: they
    share their first five characters."""
    parent, _, leaf = key.rpartition(".")
    keys = [k for k in keys if k != key]
    siblings = {k.rpartition(".")[2]: k for k in keys if k.rpartition(".")[0] == parent}
    near = nearest(leaf, siblings)
    return siblings[near] if near is not None else nearest(key, keys, cutoff=0.85)


def did_you_mean(word: str | None) -> str:
    """`` (did you mean WORD?)``, or nothing where there is no word."""
    return "" if word is None else f" (did you mean {word}?)"


def unknown_keys_hint(unknown: Sequence[str], config: DictConfig) -> str:
    """For keys added with ``+`` that no schema has (``+budget.second=3``): the nearest keys
    ``config`` has."""
    known = [key for key in dotted_keys(config) if key not in unknown]
    near = [near for key in unknown if (near := nearest_key(key, known)) is not None]
    return did_you_mean(", ".join(near) if near else None)
