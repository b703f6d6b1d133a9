"""Errors a user can cause; the CLI prints their message as one line and exits non-zero."""


class UserError(Exception):
    """Bad input (a path, a value, a missing dataset or device) explained in one line."""
