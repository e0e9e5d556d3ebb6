"""Prediction: what ``python -m <package>.predict`` does with each job.

Every process of the job runs :func:`predict`: it applies the checkpoint to its shard of the
inputs (a folder of PNG or JPEG images, one image, or an IDX images file: :mod:`ddp_engine.vision.inputs`),
and global rank 0 writes
``predictions.csv`` into the run directory (``logs/predictions/<stamp>/``): one row per input, in
input order (:data:`COLUMNS`).

Each replica predicts its own shard, inputs ``r``, ``r + world_size``, ... for global rank ``r``:
the unpadded sharding of evaluation (:func:`ddp_engine.data.sharded.unrepeated_loader`), which is
also the one ``trainer.predict`` puts in by itself, so that every input is predicted exactly once
whatever the number of processes. At the end of the prediction epoch the replicas' rows meet in
one all-gather (:class:`PredictionCSV`), and global rank 0 puts them back in input order and
writes the CSV atomically: a kill leaves the whole file or none.

The model is the checkpoint's run's, as for evaluation (:mod:`ddp_engine.config.saved_run`); the image
shape, normalization and class names are the ones the checkpoint keeps (its
:class:`~ddp_engine.vision.spec.DataSpec`). The data set's own files are not read.
"""

import logging
import math
from collections.abc import Sequence
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.callbacks import BasePredictionWriter
from lightning.pytorch.utilities import rank_zero_only
from omegaconf import DictConfig
from torch import Tensor
from torch.utils.data import default_convert

from ddp_engine.api import (
    build_model,
    build_trainer,
    keep_freed_host_memory,
    stop_on_signals,
    unrepeated_loader,
    write_csv,
)
from ddp_engine.vision.inputs import InputImages
from ddp_engine.vision.spec import checkpoint_data_spec

log = logging.getLogger(__name__)
info = rank_zero_only(log.info)

#: The predictions file, in the run directory.
PREDICTIONS_FILE = "predictions.csv"
#: Its columns: the input's name (its path relative to the folder, or its index in the IDX file),
#: the predicted class's index and name (``data.class_names``), and that class's probability
#: (softmax of the logits, 0..1, printed with 6 decimals).
COLUMNS = ("input", "class_index", "class_name", "probability")


def predict(cfg: DictConfig) -> dict:
    """One process's part of the prediction: predict its shard of the inputs; global rank 0 writes
    every replica's rows to ``predictions.csv`` (:class:`PredictionCSV`).

    Returns:
        ``predictions`` (the CSV's path), ``inputs`` (how many), ``input``, ``checkpoint`` and the
        data-parallel layout; global rank 0 also writes them to ``metrics.json``.
    """
    checkpoint = Path(cfg.ckpt_path).resolve()
    keep_freed_host_memory()  # in every process: see host_memory.py
    L.seed_everything(cfg.seed, workers=True)

    spec = checkpoint_data_spec(checkpoint, cfg.data)
    model = build_model(cfg.model, spec)
    inputs = InputImages(Path(cfg.input), spec, cfg.resize)
    predictions = Path(cfg.paths.output_dir) / PREDICTIONS_FILE
    writer = PredictionCSV(predictions, inputs.names, list(spec.class_names))
    trainer, layout = build_trainer(cfg, extra_callbacks=[writer], evaluation=True)
    loader = unrepeated_loader(
        inputs, trainer.world_size, trainer.global_rank, batch_size=layout["per_device_batch_size"],
        # InputImages serves whole batches: nothing to stack.
        collate_fn=default_convert, num_workers=cfg.data.num_workers, persistent_workers=False,
    )  # fmt: skip

    with stop_on_signals(trainer):
        # weights_only: tensors and plain values only, so that a checkpoint cannot run code when loaded.
        trainer.predict(model, loader, ckpt_path=str(checkpoint), weights_only=True, return_predictions=False)

    metrics = {
        "predictions": str(predictions), "inputs": len(inputs), "input": str(Path(cfg.input).resolve()),
        "checkpoint": str(checkpoint), **layout,
    }  # fmt: skip
    info(f"Predicted {len(inputs)} inputs with {checkpoint}: {predictions}")
    return metrics


class PredictionCSV(BasePredictionWriter):
    """Writes every replica's predictions to one CSV file, on global rank 0, in input order.

    At the end of the prediction epoch each replica takes, for each input of its shard, the class
    of highest probability and that probability; one all-gather per tensor brings every replica's
    rows to every replica (the shards, which differ in size by one at most, padded to equal size
    with index -1, as the collective needs), and global rank 0 orders them by input
    (:func:`in_input_order`) and writes them (:func:`write_predictions`).

    Args:
        path: the CSV file.
        names: the inputs' names, by input index (:func:`ddp_engine.vision.inputs.list_inputs`).
        class_names: the class names, by class index (the checkpoint's data spec).
    """

    def __init__(self, path: Path, names: Sequence[str], class_names: Sequence[str]) -> None:
        super().__init__(write_interval="epoch")
        self.path, self.names, self.class_names = Path(path), list(names), list(class_names)

    def write_on_epoch_end(
        self,
        trainer: L.Trainer,
        pl_module: L.LightningModule,
        predictions: Sequence[Tensor],
        batch_indices: Sequence[Sequence[Sequence[int]]],
    ) -> None:
        """``predictions``: this replica's ``(B, num_classes)`` probabilities per batch; ``batch_indices``: per
        dataloader (one here), per batch, the input indices of its rows (Lightning tracks them)."""
        indices = torch.tensor([index for batch in batch_indices[0] for index in batch], dtype=torch.int64)
        confidence, classes = torch.cat(list(predictions)).max(dim=1)
        # The collective needs equal shapes: every shard padded to the largest, index -1 marking padding.
        shard, count = math.ceil(len(self.names) / trainer.world_size), len(indices)
        rows = torch.full((shard, 2), -1, dtype=torch.int64)  # input index, class index
        rows[:count] = torch.stack([indices, classes], dim=1)
        padded = torch.zeros(shard)
        padded[:count] = confidence
        device = trainer.strategy.root_device  # the backend's (NCCL: the GPU)
        rows = all_gather(rows.to(device)).cpu().reshape(-1, 2)
        confidence = all_gather(padded.to(device)).cpu().reshape(-1)
        if trainer.is_global_zero:
            classes, confidence = in_input_order(rows[:, 0], rows[:, 1], confidence, len(self.names))
            write_predictions(self.path, self.names, classes, confidence, self.class_names)


def all_gather(tensor: Tensor) -> Tensor:
    """``tensor`` of every replica, ``(world_size, *tensor.shape)``, in global rank order; the shapes
    must be equal. ``torch.distributed.all_gather`` itself: Lightning's ``strategy.all_gather`` goes
    through a deprecated autograd-aware variant, which warns. Without a process group, ``tensor``
    alone."""
    if not torch.distributed.is_initialized():
        return tensor.unsqueeze(0)
    gathered = [torch.empty_like(tensor) for _ in range(torch.distributed.get_world_size())]
    torch.distributed.all_gather(gathered, tensor)
    return torch.stack(gathered)


def in_input_order(indices: Tensor, classes: Tensor, probabilities: Tensor, count: int) -> tuple[Tensor, Tensor]:
    """Every replica's rows, put in input order.

    Args:
        indices: ``(R,)`` int64 input index of each row; -1 for a padding row.
        classes: ``(R,)`` int64 predicted class of each row.
        probabilities: ``(R,)`` float32 probability of that class.
        count: the number of inputs.

    Returns:
        ``(count,)`` classes and ``(count,)`` probabilities, by input index.

    Raises:
        RuntimeError: when an input has no row or more than one (the sharding would be wrong).
    """
    real = indices >= 0
    indices, classes, probabilities = indices[real], classes[real], probabilities[real]
    order = indices.argsort()
    if not torch.equal(indices[order], torch.arange(count)):
        seen = torch.bincount(indices, minlength=count)
        raise RuntimeError(
            f"the replicas predicted {len(indices)} rows for {count} inputs: {int((seen == 0).sum())} missing, "
            f"{int((seen > 1).sum())} predicted more than once"
        )
    return classes[order], probabilities[order]


def write_predictions(
    path: Path, names: Sequence[str], classes: Tensor, probabilities: Tensor, class_names: Sequence[str]
) -> None:
    """Write ``predictions.csv`` atomically (:func:`ddp_engine.core.files.write_csv`): :data:`COLUMNS`,
    one row per input in the order of ``names``, with its class (``(N,)`` int64 ``classes``, named by
    ``class_names``) and that class's probability (``(N,)`` float32 ``probabilities``)."""
    rows = (
        (name, index, class_names[index], f"{probability:.6f}")
        for name, index, probability in zip(names, classes.tolist(), probabilities.tolist())
    )
    write_csv(path, COLUMNS, rows)
