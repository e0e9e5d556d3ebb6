"""Errors that the user fixes by changing the config or the files on disk.

The entry points print their message alone (no traceback) and exit with status 1; every other
exception keeps its traceback, since it points at a bug rather than at the user's input.
"""

import functools
import logging
import sys
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


class UsageError(Exception):
    """Base class: the message names what is wrong and how to fix it."""


class ConfigValueError(UsageError, ValueError):
    """A config value outside what is allowed."""


class BatchSizeError(ConfigValueError):
    """A batch size that is below 1 or does not split evenly over the processes."""


class DataNotAvailableError(UsageError, FileNotFoundError):
    """Data files that are neither on disk nor downloadable."""


class CheckpointError(UsageError, ValueError):
    """A checkpoint path that is missing, unreadable, untrusted or made for another model."""


class DataFormatError(UsageError, ValueError):
    """A data file that is not what the DataModule reads (format, shape, sample count, labels)."""


def exit_on_usage_error(task: Callable[..., T]) -> Callable[..., T]:
    """Wrap a Hydra task function: a :class:`UsageError` is logged as one line, then exit status 1.

    When the error comes out of ``trainer.fit`` / ``trainer.test``, Lightning has already
    stopped the other DDP processes.
    """

    @functools.wraps(task)
    def run(*args, **kwargs) -> T:
        try:
            return task(*args, **kwargs)
        except UsageError as error:
            logging.getLogger(task.__module__).error(f"{type(error).__name__}: {error}")
            sys.exit(1)

    return run
