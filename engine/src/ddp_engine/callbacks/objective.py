"""A task's objective that is never logged, refused at the first validation."""

import lightning as L
from typing_extensions import override

from ddp_engine.core.errors import ConfigValueError


class ObjectiveLogged(L.Callback):
    """Refuse a run whose objective (``task.objective``) its LightningModule does not log, at the
    end of the first validation (the sanity check's, before the first training step, unless
    ``trainer.num_sanity_val_steps=0``): Lightning's ``ModelCheckpoint`` would find out only after
    the first training epoch, and the best checkpoint, early stopping and a sweep's objective all
    need it. Checked once per process; every rank logs the same metrics, so every rank refuses alike.

    Args:
        objective: the metric the task declares (``task.objective``).

    Raises:
        ConfigValueError: from ``on_validation_end``, naming the objective and the metrics the
            validation logged.
    """

    def __init__(self, objective: str) -> None:
        self.objective = objective
        self._checked = False

    @override
    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._checked:
            return
        self._checked = True
        logged = sorted(trainer.callback_metrics)
        if self.objective not in logged:
            raise ConfigValueError(
                f"task.objective={self.objective} is never logged: the first validation logged "
                f"{', '.join(logged) or 'no metric'}. Log it in the LightningModule's validation_step "
                f"(self.log('{self.objective}', ...)) or set task.objective to one of those (and task.mode)."
            )
