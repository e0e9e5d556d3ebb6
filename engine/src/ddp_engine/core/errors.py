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


def first_line(error: BaseException) -> str:
    """The first line of ``error``'s message (its type's name when the message is empty): for
    one-line reports of errors whose messages run over several lines."""
    return (str(error).strip() or type(error).__name__).splitlines()[0]


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


class ExportError(UsageError):
    """An exported model that cannot be made here (an optional package missing) or that does not
    compute what its checkpoint's model computes (``python -m <project>.export``)."""


class JobFailedError(Exception):
    """A process of a job failed (see :func:`ddp_engine.launch.supervisor.launch`); every process has ended.

    Attributes:
        rank: the global rank that failed first.
        exitcode: its exit status (negative: killed by that signal number).
        error: the last line of its error (``RuntimeError: ...``), or the signal that killed it.
    """

    def __init__(self, rank: int, exitcode: int, error: str) -> None:
        self.rank, self.exitcode, self.error = rank, exitcode, error
        super().__init__(f"rank {rank} failed: {error}")


def exit_on_usage_error(task: Callable[..., T]) -> Callable[..., T]:
    """Wrap a Hydra task function: a :class:`UsageError` or :class:`JobFailedError` is logged as one
    line, then exit status 1. (The failed process logged its own traceback into the job's log.)"""

    @functools.wraps(task)
    def run(*args, **kwargs) -> T:
        try:
            return task(*args, **kwargs)
        except (UsageError, JobFailedError) as error:
            logging.getLogger(task.__module__).error(f"{type(error).__name__}: {error}")
            sys.exit(1)

    return run
