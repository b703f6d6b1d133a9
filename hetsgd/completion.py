"""Shell completion of `hetsgd run`'s overrides (Typer's completion, `hetsgd --install-completion`,
completes the commands and options): a config group's choices after ``algo=``, and the keys of
the config that the overrides typed so far compose (``budget.`` -> ``budget.seconds=``).

Bash splits a word at ``=`` (its ``COMP_WORDBREAKS``), so ``algo=sy`` reaches the completer as
the words ``algo``, ``=`` and ``sy``: the choices are then given for the last word alone."""

from __future__ import annotations

import os

import typer
from click.shell_completion import split_arg_string
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from hetsgd.config.keys import GROUPS, composed, config_keys, group_choices

#: What a key that is no config group may take, where its values are few.
BOOLEANS = ("true", "false")


def complete_override(ctx: typer.Context, incomplete: str) -> list[str]:
    """The completions of ``incomplete``, an argument of `hetsgd run` (Typer's autocompletion
    callback), after the arguments typed before it."""
    typed = [str(word) for word in ctx.params.get("overrides") or []]
    if typed and _bash_word() == "=":  # bash: `algo=` is `algo` then `=`, which click drops
        return [f"={value}" for value in _values(typed[-1], typed[:-1])]
    if len(typed) >= 2 and typed[-1] == "=":  # bash: `algo=sy` is `algo`, `=`, `sy`
        return [value for value in _values(typed[-2], typed[:-2]) if value.startswith(incomplete)]
    key, equals, value = incomplete.partition("=")
    if equals:
        return [f"{key}={choice}" for choice in _values(key, typed) if choice.startswith(value)]
    words = [f"{group}=" for group in GROUPS] + [f"{k}=" for k in config_keys(typed)]
    return [word for word in dict.fromkeys(words) if word.startswith(incomplete)]


def _bash_word() -> str | None:
    """The word bash completes, as bash split the line (``COMP_WORDS`` at ``COMP_CWORD``), or
    None under another shell: click reads a lone ``=`` as an empty word."""
    words, index = os.environ.get("COMP_WORDS"), os.environ.get("COMP_CWORD", "")
    if words is None or not index.isdigit():
        return None
    split = split_arg_string(words)
    return split[int(index)] if int(index) < len(split) else None


def _values(key: str, typed: list[str]) -> list[str]:
    """The values ``key`` may take: a config group's choices, or true and false for a boolean
    key of the config that ``typed`` composes."""
    if choices := group_choices(key):
        return choices
    config = composed(typed)
    if config is None:
        return []
    try:
        value = OmegaConf.select(config, key.lstrip("+~"))
    except OmegaConfBaseException:  # no key at all (`..=`): nothing to complete, no traceback
        return []
    return list(BOOLEANS) if isinstance(value, bool) else []
