"""Where the scripts find the real w8a file: the one setting ``$HETSGD_W8A`` (the path of a local
copy of LIBSVM's w8a, as published or compressed), by default ``shared/data/w8a.xz`` in the folder
that holds the repository, where CI puts it.

``python scripts/w8a_path.py`` prints the path; ``--name`` prints the name the data cache knows
the file by (``w8a``, or ``w8a`` with its compression's suffix), for a link in a cache of its own.
Imports nothing but the standard library, so a shell script asks it cheaply.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
W8A = Path(os.environ.get("HETSGD_W8A", ROOT.parent / "shared" / "data" / "w8a.xz"))
COMPRESSIONS = (".xz", ".bz2", ".gz")


def cache_name(path: Path = W8A) -> str:
    """The file name under which the data cache finds ``path`` as w8a."""
    return "w8a" + (path.suffix if path.suffix in COMPRESSIONS else "")


if __name__ == "__main__":
    print(cache_name() if sys.argv[1:] == ["--name"] else W8A.resolve())
