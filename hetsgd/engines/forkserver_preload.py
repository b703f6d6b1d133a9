"""Imported by the forkserver alone, first of ``processes.PRELOAD``: it leaves Ctrl-C and a
terminal's hangup to the coordinator, in the forkserver and in every worker forked from it.

Both signals reach the whole foreground process group, forkserver included. A forkserver ended
by a hangup would take every worker with it (their parent-death signal) before the coordinator
could stop them and keep what they measured; and a worker forked from it would otherwise restore
Python's Ctrl-C handler for the moment before its entry (``coordinator.guarded``) ignores both.
The forkserver keeps, and restores in each fork, the handlers it found once its preloads ran.

It also ends without the interpreter's teardown, as the command does (``cli._end``): once the
coordinator is gone, freeing torch takes it about a second, during which it still holds the
command's standard output and error, so that whoever reads them (a pipe, a test) waits for it.
Its exit handler, registered first of its preloads' and so run last of theirs, ends it. Its
forks never run exit handlers: each ends with ``os._exit`` when its worker returns.
"""

import atexit
import os
import signal

atexit.register(os._exit, 0)

for _signum in (signal.SIGINT, signal.SIGHUP):
    signal.signal(_signum, signal.SIG_IGN)
