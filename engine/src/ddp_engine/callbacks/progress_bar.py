"""The console progress bar: Lightning's Rich bar, with its per-step work done only when it redraws."""

import time
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import RichProgressBar
from typing_extensions import override

from ddp_engine.core.errors import ConfigValueError


class ThrottledRichProgressBar(RichProgressBar):
    """Lightning's ``RichProgressBar``, whose training bar and metrics are updated at most
    ``refresh_rate`` times per second, and at each epoch's last batch.

    Lightning's bar updates its task and reads every progress-bar metric (``.item()`` on each)
    after every training batch, although Rich draws them only ``refresh_rate`` times per second
    (its share of a step: ``benchmarks/per_step.py``). Between two redraws that work is skipped;
    what is drawn is the same. Global rank 0 only, as Lightning's.

    Args:
        refresh_rate: redraws per second, and updates of the training bar (default 2, smooth
            enough to watch; Lightning's is 100, each redraw rendered by a thread of rank 0 that
            competes with training for the CPU). 0 hides the bars.
        kwargs: the rest of ``RichProgressBar``'s arguments (``leave``, ``theme``, ``console_kwargs``).

    Raises:
        ConfigValueError: for a ``refresh_rate`` that is not a whole number of at least 0.
    """

    def __init__(self, refresh_rate: int = 2, **kwargs: Any) -> None:
        if not isinstance(refresh_rate, int) or refresh_rate < 0:
            raise ConfigValueError(
                f"callbacks.progress_bar.refresh_rate={refresh_rate}: redraws per second, a whole number, 0 to "
                "hide the bar (or trainer.enable_progress_bar=false)."
            )
        super().__init__(refresh_rate=refresh_rate, **kwargs)
        self._last_train_update = float("-inf")  # time.monotonic() of the last update

    @override
    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if not self.is_enabled:  # hidden, or a rank other than 0: Lightning's would do nothing either
            return
        now = time.monotonic()
        due = now - self._last_train_update >= 1 / self.refresh_rate
        if due or batch_idx + 1 == self.total_train_batches or self.train_progress_bar_id is None:
            self._last_train_update = now
            super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)
