"""The ways a run can end other than by completing, as exceptions.

``UserError`` is bad input: the CLI prints its message as one line and exits non-zero.
``Diverged`` is a training loss that became NaN or infinite: the run is recorded as diverged.
"""

import errno


class UserError(Exception):
    """Bad input (a path, a value, a missing dataset or device) explained in one line."""


class Diverged(Exception):
    """The training loss became NaN or infinite."""


class SearchInterrupted(KeyboardInterrupt):
    """Ctrl-C (or SIGTERM) during a tuned comparison's search: its message says how many trials
    ran and where their table is, in place of a sweep's count of jobs. Here, not with the
    search, so that the command's handler of a stop imports nothing while a signal may land."""


def one_line(message: object) -> str:
    """``message`` (an exception's text, a parser's) on one line, its whitespace runs as one
    space: what every one-line error embeds of a library's message."""
    return " ".join(str(message).split())


# What a failed allocation says where it is not a MemoryError: an mmap refused with ENOMEM (a
# shared library that cannot be loaded, torch's CPU allocator) or a thread whose stack cannot be
# mapped, as under `ulimit -v` or a cgroup's limit.
_MEMORY_MESSAGES = ("cannot allocate memory", "can't allocate memory", "failed to map segment",
                    "std::bad_alloc", "can't start new thread")


def out_of_memory(exc: BaseException) -> str | None:
    """``out of memory (CAUSE)`` where ``exc`` says the process ran out of memory or address
    space, else None: the one reason a run gives for it, wherever it struck (importing torch,
    loading data, training, drawing), in its summary and on stderr."""
    message = one_line(exc)
    if not (isinstance(exc, MemoryError)
            or (isinstance(exc, OSError) and exc.errno == errno.ENOMEM)
            or any(text in message.lower() for text in _MEMORY_MESSAGES)):
        return None
    return f"out of memory ({type(exc).__name__}{': ' + message if message else ''})"
