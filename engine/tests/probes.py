"""Test-only Lightning callbacks, loaded into real CLI runs through Hydra overrides, e.g.

    python -m <package>.train +callbacks.recorder._target_=probes.SampleRecorder \\
        +callbacks.recorder.out_dir=/tmp/samples

(engine/tests is put on PYTHONPATH by harness.cli_env; every DDP process inherits it.)
"""

import json
import os
import shutil
import signal
import time
from pathlib import Path

import lightning as L
import torch

from ddp_engine.core.lifetime import SUPERVISOR_ENV


class SampleRecorder(L.Callback):
    """Appends to ``out_dir/rank<global_rank>_epoch<epoch>.jsonl`` one line per training batch:
    ``{"step", "indices"}``, the optimizer step it is trained in and the train-split indices this
    rank trained on. Appended as it goes, so a killed run leaves its record up to the kill; a
    resumed run appends to the same files when given the same ``out_dir``.

    Each batch is checked against the dataset: its inputs must equal the train split's inputs at
    the indices the sampler yielded (normalized, for a DataModule with a ``spec``: an image data
    set's), so the record is what the model really saw.
    """

    def __init__(self, out_dir: str) -> None:
        self.out_dir = Path(out_dir)
        self.epoch, self.planned, self.taken = None, [], 0

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if self.epoch != trainer.current_epoch:
            # Lightning has called sampler.set_epoch by now; iterating the sampler again gives this
            # epoch's order (after a resume inside the epoch, its rest).
            self.epoch, self.planned, self.taken = (
                trainer.current_epoch,
                list(iter(trainer.train_dataloader.sampler)),
                0,
            )
        inputs = batch[0]
        indices = self.planned[self.taken : self.taken + len(inputs)]
        data = trainer.datamodule
        expected = data.train_set.tensors[0][indices]
        if hasattr(data, "spec"):
            expected = data.spec.normalize(expected)
        if not torch.equal(inputs.cpu(), expected):
            raise AssertionError(f"rank {trainer.global_rank}: batch {batch_idx} is not the sampler's samples")
        self.taken += len(inputs)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        with open(self.out_dir / f"rank{trainer.global_rank}_epoch{self.epoch}.jsonl", "a") as file:
            file.write(json.dumps({"step": trainer.global_step, "indices": indices}) + "\n")


class FailOnRank(L.Callback):
    """Raises in one process at one optimizer step, after writing the wall-clock time to ``marker``;
    with ``job``, only in the job whose run directory has that name (a sweep's job number)."""

    def __init__(self, rank: int, step: int, marker: str, job: str | None = None) -> None:
        self.rank, self.step, self.marker, self.job = rank, step, Path(marker), job

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if self.job is not None and Path(trainer.default_root_dir).name != str(self.job):
            return
        if trainer.global_rank == self.rank and trainer.global_step == self.step:
            self.marker.write_text(str(time.time()))
            raise RuntimeError(f"injected failure on rank {self.rank} at step {self.step}")


class FillTheDisk(L.Callback):
    """On global rank 0, after optimizer step ``step``: fill the run directory's file system but
    ``leave_bytes``, as another user's job on a shared quota would, with ``<run>/filler``; once per
    run directory (``<run>/filled``), so that its resume, once the filler is gone, trains on."""

    def __init__(self, step: int, leave_bytes: int) -> None:
        self.step, self.leave_bytes = step, leave_bytes

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if trainer.global_step != self.step or not trainer.is_global_zero:
            return
        filler, filled = Path(trainer.default_root_dir) / "filler", Path(trainer.default_root_dir) / "filled"
        if filled.exists():
            return
        filled.touch()
        with open(filler, "ab") as file:
            file.write(b"\0" * max(0, shutil.disk_usage(filler.parent).free - self.leave_bytes))


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
    before every step, so that a test can signal the run at a known point, well before it ends;
    not once the file ``release`` exists (when given); with ``job``, only in the job whose run
    directory has that name (a sweep's job number)."""

    def __init__(
        self, step: int, marker: str, seconds: float = 0.1, release: str | None = None, job: str | None = None
    ) -> None:
        self.step, self.marker, self.seconds = step, Path(marker), seconds
        self.release = Path(release) if release else None
        self.job = job

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if self.job is not None and Path(trainer.default_root_dir).name != str(self.job):
            return
        if trainer.global_rank == 0 and trainer.global_step >= self.step:
            if self.release is not None and self.release.exists():
                return
            if not self.marker.exists():
                self.marker.write_text(str(time.time()))
            time.sleep(self.seconds)


class HoldBeforeTraining(L.Callback):
    """Every process waits before its first training step until the file ``release`` exists: a run
    that a test signals meanwhile has started its processes and saved no checkpoint."""

    def __init__(self, release: str) -> None:
        self.release = Path(release)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        while trainer.global_step == 0 and not self.release.exists():
            time.sleep(0.1)


class PauseInTest(L.Callback):
    """Global rank 0 writes ``marker`` (once) and sleeps ``seconds`` before every test batch, so that
    a test can signal the run during its final test; not once the file ``release`` exists."""

    def __init__(self, marker: str, release: str, seconds: float = 1.0) -> None:
        self.marker, self.release, self.seconds = Path(marker), Path(release), seconds

    def on_test_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0) -> None:
        if trainer.global_rank == 0 and not self.release.exists():
            if not self.marker.exists():
                self.marker.write_text(str(time.time()))
            time.sleep(self.seconds)


class StallOnRank(L.Callback):
    """At optimizer step ``step``, global rank ``rank`` stops making progress (sleeps for an hour),
    as a deadlock in user code or a stuck data source would: the other ranks wait for it in their
    next collective."""

    def __init__(self, rank: int, step: int) -> None:
        self.rank, self.step = rank, step

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if trainer.global_rank == self.rank and trainer.global_step == self.step:
            stall_here_for_an_hour()


def stall_here_for_an_hour() -> None:
    """A named frame for the hang tests to find in the stalled rank's stack."""
    time.sleep(3600)


class Fault(L.Callback):
    """Injects one fault into a run, for the chaos test: at ``phase`` on global rank ``rank`` (the
    first time it gets there, from optimizer step ``step`` on), it writes ``marker`` (JSON: the time,
    its pid, its parent's pid) and then does ``action``.

    Phases: ``setup`` (right after the process group formed), ``train`` (a training step),
    ``validation`` (a validation step), ``checkpoint`` (while a checkpoint is being made),
    ``test`` (a test step). Actions: ``raise`` (a RuntimeError), ``sigkill`` / ``sigterm`` (this
    process, as the OOM killer or a scheduler would), ``sigkill_supervisor`` /
    ``sigterm_supervisor`` (the template's supervisor, the parent of the workers' forkserver).
    """

    def __init__(self, phase: str, rank: int, action: str, marker: str, step: int = 0) -> None:
        self.phase, self.rank, self.action, self.marker, self.step = phase, rank, action, Path(marker), step
        self.done = False

    def _inject(self, trainer: L.Trainer, phase: str) -> None:
        if self.done or phase != self.phase or trainer.global_rank != self.rank or trainer.global_step < self.step:
            return
        self.done = True
        partial = self.marker.with_suffix(".partial")
        partial.write_text(json.dumps({"time": time.time(), "pid": os.getpid(), "parent": os.getppid()}))
        os.replace(partial, self.marker)
        if self.action == "raise":
            raise RuntimeError(f"injected fault in {phase} on rank {self.rank}")
        target = int(os.environ[SUPERVISOR_ENV]) if self.action.endswith("_supervisor") else os.getpid()
        os.kill(target, signal.SIGKILL if self.action.startswith("sigkill") else signal.SIGTERM)

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if stage == "fit":
            self._inject(trainer, "setup")

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self._inject(trainer, "train")

    def on_validation_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0) -> None:
        if not trainer.sanity_checking:
            self._inject(trainer, "validation")

    def on_save_checkpoint(self, trainer, pl_module, checkpoint) -> None:
        self._inject(trainer, "checkpoint")

    def on_test_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0) -> None:
        self._inject(trainer, "test")


class MismatchedCollective(L.Callback):
    """At optimizer step ``step``, rank 0 AllReduces a tensor of 3 values and every other rank one
    of 5: a user bug that only torch's collective checks (``debug=ddp``) catch at once."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if trainer.global_step == self.step:
            torch.distributed.all_reduce(torch.zeros(3 if trainer.global_rank == 0 else 5))


class ValidationCounter(L.Callback):
    """Writes ``out_dir/val_rank<global_rank>_epoch<epoch>.json``: how many validation samples this
    rank evaluated in that epoch's validation (the sanity check not counted)."""

    def __init__(self, out_dir: str) -> None:
        self.out_dir, self.count = Path(out_dir), 0

    def on_validation_epoch_start(self, trainer, pl_module) -> None:
        self.count = 0

    def on_validation_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0) -> None:
        self.count += len(batch[1])

    def on_validation_epoch_end(self, trainer, pl_module) -> None:
        if trainer.sanity_checking or trainer.state.fn != "fit":
            return
        self.out_dir.mkdir(parents=True, exist_ok=True)
        (self.out_dir / f"val_rank{trainer.global_rank}_epoch{trainer.current_epoch}.json").write_text(str(self.count))


class SignalTasks(L.Callback):
    """As SLURM's ``--signal`` does before a time limit: at optimizer step ``step`` of global rank
    ``rank``, sends ``signal`` to every task whose pid is in ``pid_file`` (this one included); the
    others get it wherever they are. In the job's first run only (``SLURM_RESTART_COUNT`` unset or 0)."""

    def __init__(self, pid_file: str, rank: int, step: int, signal: str = "SIGUSR1") -> None:
        self.pid_file, self.rank, self.step, self.signal = Path(pid_file), rank, step, signal
        self.first_run = int(os.environ.get("SLURM_RESTART_COUNT") or 0) == 0

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if self.first_run and trainer.global_rank == self.rank and trainer.global_step == self.step:
            self.first_run = False
            for pid in self.pid_file.read_text().split():
                os.kill(int(pid), getattr(signal, self.signal))


class SignalJobTasks(L.Callback):
    """As SLURM's ``--signal`` (and submitit's local executor before its timeout) does: at
    optimizer step ``step`` of global rank 0, sends ``signal`` to every task of this job, the
    children of the process that started this one (submitit's job controller). Once: only while
    ``marker`` does not exist (it is created), so that the job's resumed run trains on."""

    def __init__(self, step: int, marker: str, signal: str = "SIGUSR2") -> None:
        self.step, self.marker, self.signal = step, Path(marker), signal

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if trainer.global_rank == 0 and trainer.global_step == self.step and not self.marker.exists():
            self.marker.touch()
            parent = os.getppid()
            for pid in Path(f"/proc/{parent}/task/{parent}/children").read_text().split():
                os.kill(int(pid), getattr(signal, self.signal))


class BalancedNet(torch.nn.Module):
    """Not a callback: a network for ZeRO-1's runs (``model.net._target_=probes.BalancedNet``), the
    regression's windows ``(N, channels, length)`` -> ``(N, outputs)`` through two linear layers of
    equal weights (``channels * length`` x ``hidden`` and back) and an output layer. torch's
    ZeroRedundancyOptimizer gives each rank whole tensors, so the optimizer state splits evenly
    only where no one tensor dominates, as here (the regression's own network has one)."""

    def __init__(self, channels: int, length: int, outputs: int, hidden: int = 192, dropout: float = 0.0) -> None:
        super().__init__()
        features = channels * length
        self.layers = torch.nn.Sequential(
            torch.nn.Flatten(), torch.nn.Linear(features, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, features),
            torch.nn.ReLU(), torch.nn.Dropout(dropout), torch.nn.Linear(features, outputs),
        )  # fmt: skip

    def forward(self, windows: torch.Tensor) -> torch.Tensor:
        return self.layers(windows)
