"""Plain Lightning: the reference's model and gather loader in a LightningModule, trained by
``Trainer(strategy="ddp")`` with nothing of the template.

    torchrun --standalone --nproc-per-node=2 -m benchmarks.plain_lightning \\
        --data-dir DIR --model tiny --steps 300 --out-dir RUN

What :mod:`benchmarks.per_step` holds the template's per-step cost against: Lightning's own, with
no logger, no checkpoint, no progress bar and no callback but the timer (:class:`benchmarks.probe.LoopTimer`,
which writes ``RUN/loop-timer-rank<r>.json``). The same AdamW and one-cycle schedule stepped per
optimizer step as the reference and the template; Lightning puts its own ``DistributedSampler``
under the loader (its default, ``use_distributed_sampler=True``). ``--log`` adds one ``self.log``
of the loss per step.
"""

import argparse
import os

import lightning as L
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, default_convert

from benchmarks.probe import LoopTimer
from benchmarks.reference_ddp import GatherSet, load, make_model


class Classifier(L.LightningModule):
    """``make_model(model)``, channels-last as the reference and the template hold it, with
    cross-entropy, AdamW (lr, weight decay 0.01) and a one-cycle schedule over ``total_steps``; logs
    the loss each step when ``log_loss``."""

    def __init__(self, model: str, lr: float, total_steps: int, log_loss: bool) -> None:
        super().__init__()
        self.net, self.lr, self.total_steps, self.log_loss = make_model(model), lr, total_steps, log_loss
        self.net.to(memory_format=torch.channels_last)

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        images, labels = batch
        loss = F.cross_entropy(self.net(images.contiguous(memory_format=torch.channels_last)), labels)
        if self.log_loss:
            self.log("train/loss", loss)
        return loss

    def configure_optimizers(self) -> dict:
        optimizer = torch.optim.AdamW(self.parameters(), lr=self.lr, weight_decay=0.01)
        schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=self.lr, total_steps=self.total_steps)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": schedule, "interval": "step"}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", required=True, help="folder with MNIST/raw/<four IDX files>")
    parser.add_argument("--model", choices=["cnn", "tiny"], default="tiny")
    parser.add_argument("--steps", type=int, required=True, help="optimizer steps (one epoch, cut short)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--global-batch-size", type=int, default=64)
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--log", action="store_true", help="self.log the loss every step")
    parser.add_argument("--out-dir", required=True, help="folder for loop-timer-rank<r>.json")
    args = parser.parse_args()

    L.seed_everything(args.seed)
    world_size, local_world_size = int(os.environ["WORLD_SIZE"]), int(os.environ["LOCAL_WORLD_SIZE"])
    full = load(args.data_dir, train=True)
    order = torch.randperm(len(full), generator=torch.Generator().manual_seed(0))
    train_set = GatherSet(*(t[order[5000:]] for t in full.tensors))  # the reference's 55,000 training images
    loader = DataLoader(
        train_set, batch_size=args.global_batch_size // world_size, shuffle=True, drop_last=True,
        collate_fn=default_convert,
    )  # fmt: skip
    trainer = L.Trainer(
        accelerator="gpu" if torch.cuda.is_available() else "cpu", devices=local_world_size, strategy="ddp",
        max_epochs=1, limit_train_batches=args.steps, limit_val_batches=0, num_sanity_val_steps=0,
        logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        callbacks=[LoopTimer(args.out_dir)],
    )  # fmt: skip
    trainer.fit(Classifier(args.model, args.lr, args.steps, args.log), train_dataloaders=loader)
    # As torch's documentation asks before a process exits (and the template's workers do,
    # ddp_engine.launch.worker.end_process_group): a process group alive at interpreter exit can
    # abort it from the backend's threads ("terminate called without an active exception", SIGABRT).
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
