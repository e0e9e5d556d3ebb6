"""The log filters that ``ddp_engine/conf/hydra/default.yaml`` gives the job's handlers: every process's
records carry its global rank, and the console shows one copy of each Python warning."""

import logging

# Lightning's own (``lightning.fabric.utilities.rank_zero`` re-exports it), without Lightning's import.
from lightning_utilities.core.rank_zero import rank_zero_only

from ddp_engine.core.environment import launcher_rank


def global_rank() -> int:
    """This process's global rank: Lightning's ``rank_zero_only.rank``, which Lightning sets when it
    is imported and its strategy when the process group forms; before Lightning is imported (a
    supervisor never imports it), the launcher's (:func:`~ddp_engine.core.environment.launcher_rank`)."""
    rank = getattr(rank_zero_only, "rank", None)
    return launcher_rank() if rank is None else rank


class RankFilter(logging.Filter):
    """Adds ``record.rank``: this process's global rank (0 before the process group exists)."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.rank = global_rank()
        return True


class RankZeroWarningsFilter(logging.Filter):
    """Drops Python warnings (logger ``py.warnings``) on global ranks other than 0.

    Every DDP process imports the same libraries and runs the same code, so each one would print
    the same deprecation or usage warning: on the console, rank 0's copy is enough. The log file
    keeps every rank's (its handler does not have this filter).
    """

    def filter(self, record: logging.LogRecord) -> bool:
        return record.name != "py.warnings" or global_rank() == 0


class AgentFailureFilter(logging.Filter):
    """Drops the traceback from torch's elastic agent's record of a failed worker (``failed (exitcode: ...)``).

    The agent forks the workers (``start_method="forkserver"``, :mod:`ddp_engine.launch.supervisor`)
    and then logs a worker's failure with ``logger.exception``: a traceback of its own polling code,
    not of the worker's error, which the worker has logged and the supervisor reports in one line.
    The record's one line stays.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info and record.getMessage().startswith("failed (exitcode"):
            record.exc_info, record.exc_text = None, None
        return True
