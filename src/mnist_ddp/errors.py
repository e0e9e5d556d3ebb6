"""Errors that the user fixes by changing the config or the files on disk.

The entry point prints their message alone (no traceback) and exits with status 1; every other
exception keeps its traceback, since it points at a bug rather than at the user's input.
"""


class UsageError(Exception):
    """Base class: the message names what is wrong and how to fix it."""


class ConfigValueError(UsageError, ValueError):
    """A config value outside what is allowed."""


class BatchSizeError(ConfigValueError):
    """A batch size that is below 1 or does not split evenly over the processes."""


class DataNotAvailableError(UsageError, FileNotFoundError):
    """Data files that are neither on disk nor downloadable."""
