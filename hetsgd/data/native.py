"""Loading scikit-learn, whose OpenBLAS stops the process on itself rather than fail.

OpenBLAS (scipy's, which scikit-learn loads) starts its threads as its library loads; where it
cannot, under a limit on address space (``ulimit -v``), it says so on stderr and raises SIGINT
on its own process, which Python takes for the user's Ctrl-C: the run would end "interrupted by
the user". While such a library loads under that limit, a SIGINT is taken for what it is, a
:class:`MemoryError`, so that the run fails "out of memory" as it does wherever else memory
runs out. Only the main thread may set a signal's handler; elsewhere the import goes as ever.
"""

from __future__ import annotations

import resource
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType


def _failed(signum: int, frame: FrameType | None) -> None:
    raise MemoryError("a native library (OpenBLAS) could not start its threads within the "
                      "limit on address space (ulimit -v)")


@contextmanager
def loading_native() -> Iterator[None]:
    """Around the first import of scikit-learn: a SIGINT meanwhile, under a limit on address
    space, is a :class:`MemoryError`."""
    limited = resource.getrlimit(resource.RLIMIT_AS)[0] != resource.RLIM_INFINITY
    if not limited or threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, _failed)
    try:
        yield
    finally:  # a handler set outside Python reads None: Python's own takes its place
        signal.signal(signal.SIGINT, signal.default_int_handler if previous is None else previous)
