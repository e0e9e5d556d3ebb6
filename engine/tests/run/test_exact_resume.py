"""The ExactResume callback (``ddp_engine.callbacks.exact_resume``) in one process: a resumed fit draws
the random numbers the uninterrupted fit drew, a test of a checkpoint leaves the generator alone, and
a resume whose one-cycle schedule would span other steps is refused naming both lengths. The same
guarantees over real DDP processes and the command line: ``run/test_kill_and_resume.py``."""

from pathlib import Path
from typing import Any

import lightning as L
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from ddp_engine.callbacks.exact_resume import RNG_STATE_KEY, ExactResume
from ddp_engine.core.errors import ConfigValueError

#: Training batches per epoch (of one sample each).
BATCHES = 4


class Noisy(L.LightningModule):
    """A linear layer behind dropout; records a random draw at each training step, and trains with a
    one-cycle schedule over the run's steps."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(4, 2)
        self.draws: list[torch.Tensor] = []

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        self.draws.append(torch.rand(3))
        return nn.functional.dropout(self.layer(batch[0]), 0.5).sum()

    def test_step(self, batch: Any, batch_idx: int) -> None:
        self.layer(batch[0])

    def configure_optimizers(self) -> dict:
        optimizer = torch.optim.SGD(self.parameters(), lr=0.1)
        total = self.trainer.estimated_stepping_batches
        scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=0.1, total_steps=total)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}


def trainer(root: Path, max_epochs: int, callbacks: list) -> L.Trainer:
    return L.Trainer(
        accelerator="cpu", devices=1, max_epochs=max_epochs, callbacks=[ExactResume(), *callbacks], logger=False,
        enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False, default_root_dir=root,
    )  # fmt: skip


def loader() -> DataLoader:
    # A generator of its own, as the template's loaders have: starting an iterator over a loader
    # without one draws its base seed from the global generator, which the resumed run would then
    # draw at another point than the uninterrupted one.
    return DataLoader(TensorDataset(torch.ones(BATCHES, 4)), batch_size=1, generator=torch.Generator())


class SaveAt(L.Callback):
    """Saves the fit's checkpoint to ``path`` after training batch ``step``."""

    def __init__(self, path: Path, step: int) -> None:
        self.path, self.step = path, step

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any) -> None:
        if trainer.global_step == self.step:
            trainer.save_checkpoint(self.path)


@pytest.fixture(scope="module")
def whole(tmp_path_factory) -> tuple[Noisy, Path]:
    """An uninterrupted 2-epoch fit, its checkpoint saved after step 3 (inside epoch 0)."""
    root = tmp_path_factory.mktemp("whole")
    torch.manual_seed(0)
    module = Noisy()
    trainer(root, 2, [SaveAt(root / "step3.ckpt", 3)]).fit(module, loader())
    return module, root / "step3.ckpt"


def test_a_resumed_fit_draws_the_random_numbers_of_the_uninterrupted_one(whole, tmp_path):
    module, checkpoint = whole
    assert RNG_STATE_KEY in torch.load(checkpoint, weights_only=True)
    torch.manual_seed(1)  # another generator state: the resume must restore the saved one
    resumed = Noisy()
    trainer(tmp_path, 2, []).fit(resumed, loader(), ckpt_path=checkpoint)
    assert len(resumed.draws) == 2 * BATCHES - 3
    for index, draw in enumerate(resumed.draws):
        assert torch.equal(draw, module.draws[3 + index]), f"step {3 + index}"


def test_testing_a_checkpoint_leaves_the_random_generator_alone(whole, tmp_path):
    _, checkpoint = whole
    module = Noisy()
    torch.manual_seed(2)
    before = torch.get_rng_state()
    trainer(tmp_path, 2, []).test(module, loader(), ckpt_path=checkpoint, verbose=False)
    assert torch.equal(torch.get_rng_state(), before)


def test_a_resume_whose_schedule_would_span_other_steps_is_refused(whole, tmp_path):
    _, checkpoint = whole
    with pytest.raises(ConfigValueError, match=r"schedule spans 8 optimizer steps, this run 12\. Resume with"):
        trainer(tmp_path, 3, []).fit(Noisy(), loader(), ckpt_path=checkpoint)
