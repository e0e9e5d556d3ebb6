"""Lightning's CSV logger, continued by a resume in place instead of started over."""

import csv
import warnings
from pathlib import Path

from lightning.fabric.loggers.logger import rank_zero_experiment
from lightning.pytorch import loggers
from typing_extensions import override


class CSVLogger(loggers.CSVLogger):
    """``<save_dir>/<name>/<version>/metrics.csv`` (a row per logged step, a column per tag) and
    ``hparams.yaml``, as Lightning's :class:`~lightning.pytorch.loggers.CSVLogger` writes them,
    except that the rows of an earlier start of the same run are kept.

    Lightning's writer deletes an existing ``metrics.csv`` when it starts (it takes the folder for
    a new run's), which would lose the history of a run resumed in its own directory. Here the rows
    logged before ``purge_step`` are kept and those from it on dropped, since the resumed run logs
    those steps again: what TensorBoard's ``purge_step`` does to its event files. Without
    ``purge_step`` (a restart whose checkpoint step is not known) every row is kept.

    Args:
        purge_step: the optimizer step the run resumes from (default None); the other arguments
            are Lightning's.
    """

    def __init__(self, *args, purge_step: int | None = None, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.purge_step = purge_step
        self._rows_kept = False  # whether the writer, built once by Lightning, holds the earlier rows

    @property
    @override
    @rank_zero_experiment
    def experiment(self):
        if self._rows_kept:
            return super().experiment
        # Read before Lightning's writer is built: building it deletes metrics.csv.
        kept = self._rows_before(Path(self.log_dir) / "metrics.csv", self.purge_step)
        with warnings.catch_warnings():
            # "Previous log files in this directory will be deleted": their rows are in ``kept``.
            warnings.filterwarnings("ignore", message="Experiment logs directory .* exists and is not empty")
            experiment = super().experiment
        experiment.metrics[:0] = kept  # written back, under the new header, at the first save
        self._rows_kept = True
        return experiment

    @staticmethod
    def _rows_before(path: Path, step: int | None) -> list[dict[str, str]]:
        """The rows of ``path`` (none if it does not exist) whose ``step`` is below ``step`` (all if None)."""
        if not path.is_file():
            return []
        with path.open(newline="") as file:
            rows = list(csv.DictReader(file))
        # Empty cells (a tag not logged at that step) stay empty: the writer writes "" back.
        return [row for row in rows if step is None or int(row["step"]) < step]
