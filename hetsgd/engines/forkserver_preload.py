"""Imported by the forkserver alone, first of ``processes.PRELOAD``: it leaves Ctrl-C and a
terminal's hangup to the coordinator, in the forkserver and in every worker forked from it.

Both signals reach the whole foreground process group, forkserver included. A forkserver ended
by a hangup would take every worker with it (their parent-death signal) before the coordinator
could stop them and keep what they measured; and a worker forked from it would otherwise restore
Python's Ctrl-C handler for the moment before its entry (``coordinator.guarded``) ignores both.
The forkserver keeps, and restores in each fork, the handlers it found once its preloads ran.
"""

import signal

for _signum in (signal.SIGINT, signal.SIGHUP):
    signal.signal(_signum, signal.SIG_IGN)
