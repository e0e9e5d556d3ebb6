"""What a resumed training needs beyond Lightning's own checkpoint to continue exactly as the
uninterrupted run would have: the random generators' state, and the learning-rate schedule's length."""

import lightning as L
import torch
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities import rank_zero_info
from typing_extensions import override

from ddp_engine.core.compat import saved_loader_states
from ddp_engine.core.errors import ConfigValueError

#: The checkpoint key of the random generators' state: ``{"torch": ByteTensor, "cuda": ByteTensor}``
#: (``cuda`` on GPUs only).
RNG_STATE_KEY = "rng_state"


class ExactResume(L.Callback):
    """Saves the random generators' state in every checkpoint and restores it when fit resumes, and
    refuses a resume whose learning-rate schedule would be of another length.

    - Random state: every replica is seeded alike and draws the same random numbers (dropout masks
      of equal shapes), so rank 0's CPU generator state (and on GPUs its device's) is every rank's.
      Restored, it makes the resumed run draw the masks the uninterrupted run would have drawn.
      The DataLoaders' shuffling does not depend on it (their samplers are seeded by epoch).
    - Schedule: a schedule with ``total_steps`` (``OneCycleLR``) restored from a checkpoint keeps the
      saved length, whatever this run's epochs, batch size or process count: the run would then
      end before or after its schedule. Checked once the optimizers are built (``on_fit_start``),
      before Lightning loads their state.
    - A checkpoint with no position inside its epoch (written by a version before
      :mod:`ddp_engine.data.sharding`, at an epoch's end) resumes at the next epoch; it says so.

    Raises:
        ConfigValueError: at ``on_fit_start``, for a schedule of another length than the checkpoint's.
    """

    def __init__(self) -> None:
        self.saved_schedule_steps: int | None = None

    @override
    def on_save_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict) -> None:
        checkpoint[RNG_STATE_KEY] = {"torch": torch.get_rng_state()}
        if pl_module.device.type == "cuda":
            checkpoint[RNG_STATE_KEY]["cuda"] = torch.cuda.get_rng_state(pl_module.device)

    @override
    def on_load_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict) -> None:
        # Lightning calls this for trainer.test(ckpt_path=...) too; only a resumed fit continues.
        if trainer.state.fn != TrainerFn.FITTING:
            return
        saved = [state.get("total_steps") for state in checkpoint.get("lr_schedulers", [])]
        self.saved_schedule_steps = saved[0] if saved else None
        if saved_loader_states(checkpoint) is None:
            rank_zero_info(
                f"The checkpoint holds no position inside an epoch (saved at the end of epoch {checkpoint['epoch']}, "
                "or without a DataModule's position): training resumes at the start of the next epoch."
            )
        rng = checkpoint.get(RNG_STATE_KEY, {})
        if "torch" in rng:
            torch.set_rng_state(rng["torch"])
        if "cuda" in rng and pl_module.device.type == "cuda":
            torch.cuda.set_rng_state(rng["cuda"], pl_module.device)

    @override
    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        saved, self.saved_schedule_steps = self.saved_schedule_steps, None
        configs = trainer.lr_scheduler_configs
        steps = getattr(configs[0].scheduler, "total_steps", None) if configs else None
        if saved is not None and steps is not None and saved != steps:
            raise ConfigValueError(
                f"ckpt_path: the checkpoint's learning-rate schedule spans {saved} optimizer steps, this run "
                f"{steps}. Resume with the original run's trainer.max_epochs, trainer.max_steps, "
                "trainer.limit_train_batches, data.global_batch_size and trainer.accumulate_grad_batches (its "
                ".hydra/overrides.yaml), or resume in place (hydra.run.dir=<run> ckpt_path=last), which keeps them. "
                "A one-cycle schedule cannot be lengthened: to train for longer, start a new run with more epochs."
            )
