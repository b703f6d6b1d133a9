"""The ways a run can end other than by completing, as exceptions.

``UserError`` is bad input: the CLI prints its message as one line and exits non-zero.
``Diverged`` is a training loss that became NaN or infinite: the run is recorded as diverged.
"""


class UserError(Exception):
    """Bad input (a path, a value, a missing dataset or device) explained in one line."""


class Diverged(Exception):
    """The training loss became NaN or infinite."""
