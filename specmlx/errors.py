"""Errors that reach the user as one line.

Library code raises these; the CLI prints the message alone and exits with `exit_code`
(2 for bad usage, 1 for everything that went wrong at run time). Anything else that escapes
is a bug and keeps its traceback.
"""


class SpecmlxError(Exception):
    """A failure the user can act on; its message is the whole report."""

    exit_code = 1


class UsageError(SpecmlxError):
    """Bad arguments: an option out of range, or options that contradict each other."""

    exit_code = 2
