"""Memory a parse freed, given back to the system once the data is in shared memory.

A table's parse (pandas over pyarrow) allocates several times the table's size and frees it
when its arrays are copied out; the allocators keep what was freed for their next request:
pyarrow's pool (mimalloc or jemalloc) and glibc's heap, whose threshold for mapping a large
block on its own rises with every large block freed. A coordinator would hold some 0.9 GB of a
400 MB table's parse for the whole run, beside the copy in shared memory (measured with
``psutil``'s PSS, docs/datasets.md). Both are asked to return it.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys


def give_back_freed() -> None:
    """Return the memory pyarrow's pool and glibc's heap keep free to the system: what a parse
    left behind. Elsewhere (musl, macOS) there is no heap to trim, and nothing is done."""
    pyarrow = sys.modules.get("pyarrow")
    if pyarrow is not None:
        pyarrow.default_memory_pool().release_unused()
    name = ctypes.util.find_library("c")
    libc = ctypes.CDLL(name) if name else None
    if libc is not None and hasattr(libc, "malloc_trim"):
        libc.malloc_trim(0)
