"""Checkpoint files that a kill during saving can never leave half-written."""

import os
import tempfile
from pathlib import Path
from typing import Any

import torch
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO


class AtomicCheckpointIO(TorchCheckpointIO):
    """Lightning's ``TorchCheckpointIO``, writing each checkpoint beside its final path and renaming it.

    Lightning's own save writes into a temporary file from ``tempfile.mkstemp()`` (the system
    temp folder) and moves it into place. When that folder is on another filesystem than the
    checkpoints, as a node-local ``/tmp`` and a shared checkpoint folder are on most clusters, the
    move is a copy into the final path: a process killed during the copy leaves ``last.ckpt``
    truncated, with no good copy left. (And a large checkpoint may not fit in ``/tmp`` at all.)

    Here the checkpoint is written to a hidden temporary file in the checkpoint's own folder
    (``.<name>.<random>.tmp``), flushed to disk (``fsync``), and renamed over the final path with
    ``os.replace``, which is atomic within one filesystem: the path holds the previous complete
    checkpoint until the new one is complete. A kill can leave the temporary file behind, never
    a corrupt checkpoint; the next complete save of the same checkpoint removes such leftovers.
    Local paths only (what this template writes); loading is Lightning's.

    Raises:
        TypeError: if ``storage_options`` is given (as Lightning's does).
    """

    def save_checkpoint(self, checkpoint: dict[str, Any], path: str | Path, storage_options: Any = None) -> None:
        if storage_options is not None:
            raise TypeError(f"{type(self).__name__}.save_checkpoint takes no storage_options")
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        descriptor, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        try:
            with os.fdopen(descriptor, "wb") as file:
                torch.save(checkpoint, file)
                file.flush()
                os.fsync(file.fileno())
            os.replace(temporary, path)
        except BaseException:
            Path(temporary).unlink(missing_ok=True)
            raise
        # The rename itself reaches the disk with the folder's entry.
        folder = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(folder)
        finally:
            os.close(folder)
        # Global rank 0 alone saves: another file of this pattern is a save that was killed.
        for leftover in path.parent.glob(f".{path.name}.*.tmp"):
            leftover.unlink(missing_ok=True)
