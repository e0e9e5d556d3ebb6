"""Test-only Lightning callbacks, loaded into real CLI runs through Hydra overrides, e.g.

    python -m mnist_ddp.train +callbacks.recorder._target_=probes.SampleRecorder \\
        +callbacks.recorder.out_dir=/tmp/samples

(tests/ is put on PYTHONPATH by conftest.cli_env; every DDP process inherits it.)
"""

import json
import os
import signal
import time
from pathlib import Path

import lightning as L
import torch


class SampleRecorder(L.Callback):
    """Writes ``out_dir/rank<global_rank>_epoch<epoch>.json``: the train-split indices this rank trained on.

    Each batch is checked against the dataset: its images must equal the train split's images at
    the indices the sampler yielded, so the record is what the model really saw.
    """

    def __init__(self, out_dir: str) -> None:
        self.out_dir = Path(out_dir)

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # Lightning has called sampler.set_epoch(epoch) by now; iterating it again gives this epoch's order.
        self.planned = list(iter(trainer.train_dataloader.sampler))
        self.seen: list[int] = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        images, _ = batch
        indices = self.planned[len(self.seen) : len(self.seen) + len(images)]
        expected = trainer.datamodule.train_set.tensors[0][indices]
        if not torch.equal(images.cpu(), expected):
            raise AssertionError(f"rank {trainer.global_rank}: batch {batch_idx} is not the sampler's samples")
        self.seen.extend(indices)

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.out_dir.mkdir(parents=True, exist_ok=True)
        path = self.out_dir / f"rank{trainer.global_rank}_epoch{trainer.current_epoch}.json"
        path.write_text(json.dumps(self.seen))


class FailOnRank(L.Callback):
    """Raises in one process at one optimizer step, after writing the wall-clock time to ``marker``."""

    def __init__(self, rank: int, step: int, marker: str) -> None:
        self.rank, self.step, self.marker = rank, step, Path(marker)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if trainer.global_rank == self.rank and trainer.global_step == self.step:
            self.marker.write_text(str(time.time()))
            raise RuntimeError(f"injected failure on rank {self.rank} at step {self.step}")


class StopAfterEpoch(L.Callback):
    """Ends ``fit`` after the given epoch, as an interrupted run would (its last.ckpt is that epoch's)."""

    def __init__(self, epoch: int) -> None:
        self.epoch = epoch

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.current_epoch == self.epoch:
            trainer.should_stop = True


class ElasticProbe(L.Callback):
    """For torchrun restart tests: appends one JSON line to ``record`` per training start (global
    rank 0: attempt = torchrun's restart count, the epoch and step fit starts from, the time), and
    on ``kill_rank`` in the first attempt, at optimizer step ``kill_step``, writes its pid and the
    time and kills its own process with SIGKILL, as a lost node or an OOM kill would."""

    def __init__(self, record: str, kill_rank: int, kill_step: int) -> None:
        self.record, self.kill_rank, self.kill_step = Path(record), kill_rank, kill_step
        self.attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))

    def _append(self, **entry) -> None:
        with self.record.open("a") as file:
            file.write(json.dumps({**entry, "attempt": self.attempt, "time": time.time()}) + "\n")

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.global_rank == 0:
            self._append(start_epoch=trainer.current_epoch, start_step=trainer.global_step, pid=os.getpid())

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if self.attempt == 0 and trainer.global_rank == self.kill_rank and trainer.global_step == self.kill_step:
            self._append(killed_step=trainer.global_step, pid=os.getpid())
            os.kill(os.getpid(), signal.SIGKILL)


class RankRecorder(L.Callback):
    """Writes ``out_dir/rank<global_rank>.json``: the global rank, local rank, node rank and world size
    Lightning gave this process, and its pid."""

    def __init__(self, out_dir: str) -> None:
        self.out_dir = Path(out_dir)

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.out_dir.mkdir(parents=True, exist_ok=True)
        ranks = {key: getattr(trainer, key) for key in ("global_rank", "local_rank", "node_rank", "world_size")}
        (self.out_dir / f"rank{trainer.global_rank}.json").write_text(json.dumps({**ranks, "pid": os.getpid()}))


class PauseAfterStep(L.Callback):
    """From optimizer step ``step`` on, global rank 0 writes ``marker`` (once) and sleeps ``seconds``
    before every step, so that a test can signal the run at a known point, well before it ends."""

    def __init__(self, step: int, marker: str, seconds: float = 0.1) -> None:
        self.step, self.marker, self.seconds = step, Path(marker), seconds

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if trainer.global_rank == 0 and trainer.global_step >= self.step:
            if not self.marker.exists():
                self.marker.write_text(str(time.time()))
            time.sleep(self.seconds)
