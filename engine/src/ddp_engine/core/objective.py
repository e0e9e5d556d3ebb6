"""The task's objective and the metrics it summarizes, as the engine reads them (``conf/task/``).

The task declares them once (``task.objective``, ``task.mode``, ``task.metrics``); the best
checkpoint, the sweeps (Optuna's direction, ``summary.csv``), ``metrics.json``, TensorBoard's
HPARAMS and the final lines of train and eval all read them here or from the config, and name
no metric of their own.
"""

from collections.abc import Mapping, Sequence
from enum import Enum


class Mode(str, Enum):
    """``task.mode``: whether the objective is better higher (``max``, an accuracy) or lower
    (``min``, a loss or an error); Lightning's ``ModelCheckpoint(mode=...)`` words."""

    max = "max"
    min = "min"

    @property
    def optuna_direction(self) -> str:
        """Optuna's word for it (``maximize`` / ``minimize``)."""
        return {Mode.max: "maximize", Mode.min: "minimize"}[self]


def metrics_line(metrics: Mapping[str, object], names: Sequence[str]) -> str:
    """``"val/mse 0.0912, test/mse 0.1008"``: each of ``names`` (``task.metrics``) that ``metrics``
    holds, in that order, to 4 decimals; ``"no metric of task.metrics"`` when it holds none (an
    evaluation logs no ``val/`` metric, a task may log fewer than it names)."""
    shown = [f"{name} {float(metrics[name]):.4f}" for name in names if isinstance(metrics.get(name), int | float)]
    return ", ".join(shown) or f"no metric of task.metrics ({', '.join(names)})"
