"""Where runs go and what their folders are called: ``$HETSGD_RESULTS`` (`results_folder`),
and directory names made from config values: run and sweep-job folders are named after override
values, which the user types freely, so every name goes through `safe_component` (registered as
the `${hetsgd.safe:...}` resolver) before Hydra makes a directory of it."""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path

#: The most characters a name may have: far below the 255 bytes file systems allow.
MAX_COMPONENT = 120

# runs of anything else (`/`, `\`, spaces, control characters, unicode) and of two dots or more
_UNSAFE = re.compile(r"(?:[^A-Za-z0-9=,+\-_.]|\.{2,})+")


def results_folder() -> Path:
    """Where runs go unless told otherwise: ``$HETSGD_RESULTS``, else ``results`` (the
    config's ``results_dir``, through the ``${hetsgd.results:}`` resolver). An empty value is
    unset: an ``export HETSGD_RESULTS=$DIR`` with ``DIR`` unset wrote runs under ``/runs``."""
    return Path(os.environ.get("HETSGD_RESULTS") or "results")


def safe_component(value: object, max_len: int = MAX_COMPONENT) -> str:
    """`value` as one directory name: only letters, digits, `=`, `,`, `+`, `-`, `_` and `.` (never
    leading or trailing, never two in a row), so no separator, `..`, hidden name or control
    character; each run of other characters (`../../` included) becomes one `_`. A name longer
    than `max_len` keeps a readable prefix and ends in a short hash of the whole value, so
    distinct long values stay distinct. Safe short names come back unchanged; empty gives `_`."""
    text = str(value)
    name = _UNSAFE.sub("_", text)
    name = re.sub(r"^\.|\.$", "_", name) or "_"
    if len(name) > max_len:
        digest = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:10]
        prefix = name[:max(0, max_len - len(digest) - 1)].rstrip(".")
        name = f"{prefix}-{digest}"
    return name
