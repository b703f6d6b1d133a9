"""The console command's entry point (``hetsgd``, ``python -m hetsgd``): a Ctrl-C while the
command's own modules load ends it as a stop does anywhere else, with 130 and a word, not a
traceback through an import: the command's handlers exist only once :mod:`hetsgd.cli` has
loaded (about a second on a cold start)."""

from __future__ import annotations

import sys


def main() -> None:
    try:
        from hetsgd.cli import main as command
    except KeyboardInterrupt:
        print("Aborted!", file=sys.stderr)
        sys.exit(130)
    command()
