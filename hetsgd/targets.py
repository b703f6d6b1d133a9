"""The one ``_target_`` resolver, for a user's model factory (``model._target_``) and algorithm
(``algo._target_``): the object a dotted path names, found as Hydra finds a ``_target_`` (its
longest importable module prefix, then attributes), or one line saying why it cannot be found,
worded the same for both. What the user's module raises while it is imported is a line of its
own, never a traceback."""

from __future__ import annotations

import importlib
from typing import Any

from hetsgd.errors import UserError, one_line


def raised(key: str, target: str, exc: BaseException, doing: str) -> UserError:
    """What the user's code raised while ``doing``, as one line naming ``key=target``."""
    said = f": {one_line(exc)}" if str(exc) else ""
    return UserError(f"{key}={target}: {doing} raised {type(exc).__name__}{said}")


def locate(key: str, target: str) -> Any:
    """The object ``target`` names (``key`` is the config key that names it, for the errors)."""
    parts = target.split(".")
    if not all(parts):
        raise UserError(f"{key}={target}: not a dotted path PKG.MODULE[.NAME]")
    if parts[0] in ("__main__", "__mp_main__"):  # a worker never runs the script or notebook
        raise UserError(f"{key}={target}: worker processes cannot import the script or notebook "
                        "that starts the run; put it in a module of its own (beside the "
                        "script) and name that")
    for i in range(len(parts), 0, -1):
        name = ".".join(parts[:i])
        try:
            obj = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name is not None and f"{name}.".startswith(f"{exc.name}."):
                continue  # this prefix is no module: a shorter one may be
            raise raised(key, target, exc, f"importing {name}") from None
        except Exception as exc:  # noqa: BLE001 - the user's module, imported
            raise raised(key, target, exc, f"importing {name}") from None
        for attribute in parts[i:]:
            if not hasattr(obj, attribute):
                raise UserError(f"{key}={target}: {name} has no attribute {attribute!r}")
            obj, name = getattr(obj, attribute), f"{name}.{attribute}"
        return obj
    raise UserError(f"{key}={target}: no module named {parts[0]!r}; is its package on "
                    "PYTHONPATH?")
