"""Checkpoint files that a kill during saving can never leave half-written, a ``last.ckpt`` kept
fresh inside epochs, checkpoints checked before a run loads them, and the step a resume in place
starts from."""

import pickle
import zipfile
from datetime import timedelta
from functools import cached_property
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO
from lightning.pytorch.callbacks import ModelCheckpoint
from torch import nn
from typing_extensions import override

from ddp_engine.core.compat import also_save_at_epoch_end, save_checkpoint_now
from ddp_engine.core.errors import CheckpointError, ConfigValueError, first_line
from ddp_engine.core.files import atomic_path
from ddp_engine.core.run_dir import check_checkpoint_file

#: How many names of each kind of mismatch a message lists.
LISTED_KEYS = 6


def check_checkpoint(path: str | Path, model: nn.Module, key: str = "ckpt_path") -> None:
    """Open a checkpoint as the run will, and check that it fits ``model``: before any process
    launches, so that a bad ``ckpt_path`` is one line instead of an error in every process.

    It is loaded with ``torch.load(weights_only=True)``, as the entry points have Lightning load
    it: tensors and plain values only, so a checkpoint from an untrusted source cannot run code
    while it is read (https://pytorch.org/docs/stable/notes/serialization.html#weights-only).

    Args:
        path: the checkpoint file.
        model: the LightningModule the run builds; its ``state_dict()`` keys and shapes must be
            the checkpoint's.
        key: the config key named in the messages (default ``ckpt_path``).

    Raises:
        CheckpointError: when the file does not exist; cannot be read as a checkpoint (truncated,
            corrupt, another kind of file); holds objects other than tensors and plain values
            (pickled code, which weights-only loading refuses: the message names them, from torch
            2.6 on, :func:`unsafe_globals`); or holds another model's weights: the message lists the
            missing and unexpected keys and the other shapes.
    """
    path = Path(path)
    check_checkpoint_file(path, key)
    corrupt = (
        f"{key}={path} cannot be read as a checkpoint (truncated or corrupt: {{}}). "
        "Use another one, such as the run's last.ckpt or the best epoch_<N>.ckpt."
    )
    # torch.save writes a zip archive, whose directory is at its end: a file cut short has none.
    if not zipfile.is_zipfile(path):
        raise CheckpointError(corrupt.format("not a zip archive, as torch.save writes"))
    try:
        checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as error:
        # Refused by the weights-only unpickler, or a pickle it cannot parse: the error's type does
        # not tell which, torch's scan of the pickle for the objects it refuses does.
        try:
            refused = unsafe_globals(path)
        # Any failure of the scan (no data.pkl in the archive, a pickle cut short or with an unknown
        # opcode: RuntimeError, EOFError, UnpicklingError, struct.error, ...): the pickle is corrupt.
        except Exception as unreadable:
            raise CheckpointError(
                corrupt.format(f"its pickled data does not parse: {first_line(unreadable)}")
            ) from None
        if refused is None:
            raise CheckpointError(
                f"{key}={path} cannot be loaded with weights_only: it is corrupt, or it holds Python objects "
                "other than tensors and plain values, which loading with weights_only refuses (a checkpoint from "
                f"an untrusted source must not run code); torch {torch.__version__} does not tell which, torch "
                f"2.6 or later does. torch.load says: {' '.join(str(error).split())} Use a checkpoint this "
                "template wrote, such as the run's last.ckpt or the best epoch_<N>.ckpt."
            ) from None
        if refused:
            raise CheckpointError(
                f"{key}={path} holds Python objects other than tensors and plain values ({', '.join(refused)}), "
                "which loading with weights_only refuses: a checkpoint from an untrusted source must not run code. "
                "Use a checkpoint this template wrote."
            ) from None
        raise CheckpointError(corrupt.format(first_line(error))) from None
    except (RuntimeError, zipfile.BadZipFile, OSError) as error:  # the archive itself
        raise CheckpointError(corrupt.format(first_line(error))) from None
    # Anything else torch's unpickler raises on bytes that are no pickle (EOFError, IndexError,
    # KeyError, struct.error, ...: it depends on the bytes): the pickle is corrupt.
    except Exception as error:
        raise CheckpointError(corrupt.format(f"its pickled data does not parse: {first_line(error)}")) from None
    if not isinstance(checkpoint, dict) or "state_dict" not in checkpoint:
        raise CheckpointError(f"{key}={path} is not a Lightning checkpoint (it has no state_dict).")
    saved = {name: tuple(tensor.shape) for name, tensor in checkpoint["state_dict"].items()}
    expected = {name: tuple(tensor.shape) for name, tensor in model.state_dict().items()}
    problems = {
        "missing keys": sorted(expected.keys() - saved.keys()),
        "unexpected keys": sorted(saved.keys() - expected.keys()),
        "other shapes": [
            f"{name} {saved[name]} in the checkpoint, {expected[name]} in the model"
            for name in sorted(saved.keys() & expected.keys())
            if saved[name] != expected[name]
        ],
    }
    listed = [
        f"{kind} ({len(names)}): {', '.join(names[:LISTED_KEYS])}{', ...' if len(names) > LISTED_KEYS else ''}"
        for kind, names in problems.items()
        if names
    ]
    if listed:
        raise CheckpointError(
            f"{key}={path} was saved from another model configuration: {'; '.join(listed)}. Use the model "
            "settings of the run that saved it (model=..., model.net.* in its .hydra/overrides.yaml)."
        )


def unsafe_globals(path: Path) -> list[str] | None:
    """The classes and functions that checkpoint ``path`` pickles and ``torch.load(weights_only=True)``
    refuses, as ``module.name`` (``["posix.system"]``), sorted (``[]`` for none); None with a torch
    older than 2.6, which cannot tell.

    From ``torch.serialization.get_unsafe_globals_in_checkpoint`` (public since torch 2.6, pytorch
    PR 139106), a static scan of the pickle's GLOBAL instructions that imports and runs nothing.
    Before it, only the text of the weights-only unpickler's error named a refused object, in words
    that changed between versions: a torch without the function gets a message that names both
    possible causes and quotes torch's error, rather than a choice made from that text (no torch
    older than 2.14.1 installs on the machines CI runs on, so such a branch would go untested).

    Raises:
        Exception: what torch's scan raises for a file it cannot read as a ``torch.save`` archive
            (``ValueError``, ``RuntimeError``) or whose pickle does not parse (``EOFError``,
            ``pickle.UnpicklingError``, ``struct.error``, ...).
    """
    find = getattr(torch.serialization, "get_unsafe_globals_in_checkpoint", None)
    return None if find is None else sorted(find(path))


def at_optimizer_step_boundary(trainer: L.Trainer, batch_idx: int) -> bool:
    """In ``on_train_batch_end`` of the batch ``batch_idx`` (the hook's argument: its index in the
    epoch, counting the batches before a resume): whether it completes a gradient accumulation
    (every ``trainer.accumulate_grad_batches``-th batch of the epoch): the optimizer has stepped
    and no gradient is pending, a point to save and resume from. Between accumulated micro-batches
    it is not (their gradients are in no checkpoint), nor at the step Lightning takes on an epoch's
    last batch when that cuts an accumulation short. The same on every rank, which train equal
    batch counts."""
    return (batch_idx + 1) % trainer.accumulate_grad_batches == 0


class AtomicCheckpointIO(TorchCheckpointIO):
    """Lightning's ``TorchCheckpointIO``, writing each checkpoint beside its final path and renaming it.

    Lightning's own save writes into a temporary file from ``tempfile.mkstemp()`` (the system
    temp folder) and moves it into place. When that folder is on another filesystem than the
    checkpoints, as a node-local ``/tmp`` and a shared checkpoint folder are on most clusters, the
    move is a copy into the final path: a process killed during the copy leaves ``last.ckpt``
    truncated, with no good copy left. (And a large checkpoint may not fit in ``/tmp`` at all.)

    A save that finds no space (a full disk or quota) raises one line that says so, names the path,
    the space left and the checkpoint's size (:class:`~ddp_engine.core.files.NoSpaceError`), and
    leaves the previous checkpoint as it was.

    Here the checkpoint is written to a hidden temporary file in the checkpoint's own folder
    (``.<name>.<pid>.<random>.tmp``), flushed to disk, and renamed over the final path
    (:func:`ddp_engine.core.files.atomic_path`): the path holds the previous complete checkpoint
    until the new one is complete. A kill can leave the temporary file behind, never
    a corrupt checkpoint; the next complete save of the same checkpoint removes such leftovers.
    Local paths only (what this template writes); loading is Lightning's.

    Raises:
        TypeError: if ``storage_options`` is given (as Lightning's does).
    """

    def save_checkpoint(self, checkpoint: dict[str, Any], path: str | Path, storage_options: Any = None) -> None:
        if storage_options is not None:
            raise TypeError(f"{type(self).__name__}.save_checkpoint takes no storage_options")
        path = Path(path)
        # About its size, for the message of a save that finds no space: its tensors', or its previous
        # version's where that is larger (a small model's file is mostly the archive's own records).
        needed = max(tensor_bytes(checkpoint), path.stat().st_size if path.is_file() else 0)
        with atomic_path(path, suffix=".tmp", durable=True, needed=needed) as temporary:
            # Into a file of ours: torch's writer then reports a full disk as the file's own error
            # (ENOSPC), not as a bare "unexpected pos" (atomic_path names it).
            with open(temporary, "wb") as file:
                torch.save(checkpoint, file)
        # Global rank 0 alone saves: another file of this pattern is a save that was killed.
        for leftover in path.parent.glob(f".{path.name}.*.tmp"):
            leftover.unlink(missing_ok=True)


def tensor_bytes(value: Any) -> int:
    """The bytes of the tensors in ``value`` (a checkpoint: nested dicts, lists and tuples), about
    the size of its file."""
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, dict):
        return sum(tensor_bytes(item) for item in value.values())
    if isinstance(value, list | tuple):
        return sum(tensor_bytes(item) for item in value)
    return 0


class LastCheckpoint(ModelCheckpoint):
    """``last.ckpt`` to resume from: rewritten at the end of every epoch and, inside an epoch,
    every ``every_n_train_steps`` optimizer steps or every ``train_time_interval``.

    Lightning's ``ModelCheckpoint`` takes one trigger, epochs or steps or time; a resume point
    needs the epoch's end (validated weights, the next epoch's start) and a bound on the work a kill
    inside a long epoch loses. Saves inside an epoch come at optimizer-step boundaries only
    (never between two accumulated micro-batches, whose gradients a checkpoint does not hold).
    What an exact resume needs beyond Lightning's own state (the data position) is saved by the
    training dataloader (:mod:`ddp_engine.data.sharding`).

    Args:
        dirpath: the checkpoint folder.
        every_n_train_steps: optimizer steps between saves inside an epoch, or None (the config's
            default: ``ddp_engine/conf/callbacks/default.yaml``).
        train_time_interval: time between saves inside an epoch, or None (the config's default:
            30 minutes). Its time check is a broadcast from rank 0, so that every rank decides alike.
        time_check_every_n_steps: optimizer steps between two time checks (the config's default: 50).
            Lightning checks the time after every step, and its broadcast (a pickled object: two
            collectives) costs a sixth of a small model's step on gloo (``benchmarks/per_step.py``);
            a save is then at most this many steps late.

    Raises:
        ConfigValueError: when both are set (Lightning takes one trigger inside an epoch), or
            ``time_check_every_n_steps`` is below 1.
    """

    def __init__(
        self,
        dirpath: str,
        every_n_train_steps: int | None,
        train_time_interval: timedelta | None,
        time_check_every_n_steps: int,
    ) -> None:
        if every_n_train_steps is not None and train_time_interval is not None:
            raise ConfigValueError(
                f"callbacks.last_checkpoint: every_n_train_steps={every_n_train_steps} and train_time_interval="
                f"{train_time_interval} are both set; keep one (callbacks.last_checkpoint.train_time_interval=null "
                "to save every N steps)."
            )
        if time_check_every_n_steps < 1:
            raise ConfigValueError(
                f"callbacks.last_checkpoint.time_check_every_n_steps={time_check_every_n_steps} must be at least 1."
            )
        super().__init__(
            dirpath=dirpath,
            filename="last",
            monitor=None,
            save_top_k=1,
            enable_version_counter=False,
            every_n_train_steps=every_n_train_steps,
            train_time_interval=train_time_interval,
        )
        #: Whether Lightning's own epoch trigger saves at each epoch's end; else :meth:`on_train_epoch_end` does.
        self.saves_at_epoch_end = also_save_at_epoch_end(self)  # after Lightning's check that one trigger is set
        self.train_time_interval = train_time_interval
        self.time_check_every_n_steps = time_check_every_n_steps

    @override
    @cached_property
    def state_key(self) -> str:
        # Lightning formats this key from the settings (a dict's repr) at every callback hook it
        # calls, six per optimizer step; they are fixed once built, so it is formatted once.
        return super().state_key

    def save(self, trainer: L.Trainer) -> None:
        """Write ``last.ckpt`` now: on every rank together, at an optimizer-step boundary (for a
        save that another trigger decides, such as SLURM's requeue signal)."""
        save_checkpoint_now(self, trainer)

    @override
    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        super().on_train_epoch_end(trainer, pl_module)
        if not self.saves_at_epoch_end:
            self.save(trainer)

    @override
    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        # The same on every rank (equal batch counts), so no rank skips the time check's broadcast alone.
        if not at_optimizer_step_boundary(trainer, batch_idx):
            return
        # global_step too is the same on every rank: all skip the time check's broadcast together.
        if self.train_time_interval is not None and trainer.global_step % self.time_check_every_n_steps:
            return
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)
