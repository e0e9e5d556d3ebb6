"""What one rank of a planned layout holds at the end of its first optimizer step, measured in the
step itself (``python -m <package>.plan``: one rank over torch's fake process group)."""

from dataclasses import dataclass

import lightning as L
import torch
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.nn.parallel import DistributedDataParallel
from typing_extensions import override

from ddp_engine.core.compat import ddp_logging_data, zero_partition
from ddp_engine.distributed.footprint import (
    SavedActivations,
    TensorFootprint,
    bucket_sizes,
    state_bytes_per_parameter,
    tensor_footprint,
)


@dataclass(frozen=True)
class StepFigures:
    """One rank's figures at the end of its first optimizer step (bytes).

    Attributes:
        tensors: its parameters, gradients, DDP buckets and optimizer state
            (:class:`~ddp_engine.distributed.footprint.TensorFootprint`).
        activations: what autograd kept from a micro-batch's forward for its backward, the largest
            micro-batch's (:class:`~ddp_engine.distributed.footprint.SavedActivations`).
        batch_size: the samples of that micro-batch (the DataModule's ``batch_samples``; None where
            it has none): the per-device batch, unless the rank's shard holds fewer samples.
        bucket_sizes: DDP's gradient buckets (None where torch keeps no record of them).
        optimizer_state_unsharded: the whole optimizer state, as one rank keeps it without ZeRO-1
            (None when the run shards it: each rank then holds its share only).
        optimizer_state_zero: ZeRO-1's share of every rank, rank by rank (None where torch's
            partition cannot be read: :func:`~ddp_engine.core.compat.zero_partition`).
    """

    tensors: TensorFootprint
    activations: int
    batch_size: int | None
    bucket_sizes: list[int] | None
    optimizer_state_unsharded: int | None
    optimizer_state_zero: list[int] | None


class PlannedStep(L.Callback):
    """Measures the first optimizer step of the fit into :attr:`figures` (:class:`StepFigures`)."""

    def __init__(self) -> None:
        self.figures: StepFigures | None = None
        self._counting: SavedActivations | None = None
        self._activations = 0
        self._batch_size: int | None = None

    @override
    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch, batch_idx: int) -> None:
        self._counting = SavedActivations(excluded=pl_module.parameters()).__enter__()

    @override
    def on_before_backward(self, trainer: L.Trainer, pl_module: L.LightningModule, loss: torch.Tensor) -> None:
        self._stop_counting()

    @override
    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        self._stop_counting()

    def _stop_counting(self) -> None:
        if self._counting is not None:
            self._counting.__exit__(None, None, None)
            self._activations = max(self._activations, self._counting.bytes)
            self._counting = None

    @override
    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs, batch, batch_idx) -> None:
        self._stop_counting()
        if hasattr(trainer.datamodule, "batch_samples"):
            self._batch_size = max(self._batch_size or 0, trainer.datamodule.batch_samples(batch))
        if self.figures is not None or trainer.global_step == 0:  # inside an accumulation: no step yet
            return
        ddp = trainer.strategy.model if isinstance(trainer.strategy.model, DistributedDataParallel) else None
        sharded = any(isinstance(optimizer, ZeroRedundancyOptimizer) for optimizer in trainer.optimizers)
        per_parameter = {
            param: size
            for optimizer in trainer.optimizers
            for param, size in state_bytes_per_parameter(optimizer).items()
        }
        self.figures = StepFigures(
            tensors=tensor_footprint(pl_module, trainer.optimizers, ddp),
            activations=self._activations,
            batch_size=self._batch_size,
            bucket_sizes=None if ddp is None else bucket_sizes(ddp_logging_data(ddp)),
            optimizer_state_unsharded=None if sharded else sum(per_parameter.values()),
            optimizer_state_zero=_zero_shares(trainer.optimizers, per_parameter, sharded),
        )


def _zero_shares(
    optimizers: list[torch.optim.Optimizer], per_parameter: dict[torch.Tensor, int], sharded: bool
) -> list[int] | None:
    """Each rank's bytes of optimizer state under ZeRO-1: torch's partition of the parameters
    (the run's own, or that of a ``ZeroRedundancyOptimizer`` over the same groups), each share
    summed from ``per_parameter``. Where the run shards already, only this rank's share is known:
    None."""
    if sharded:
        return None
    shares: list[int] | None = None
    for optimizer in optimizers:
        groups = [{"params": group["params"]} for group in optimizer.param_groups]
        partition = zero_partition(ZeroRedundancyOptimizer(groups, optimizer_class=torch.optim.SGD, lr=0.0))
        if partition is None:
            return None
        ranks = [sum(per_parameter.get(param, 0) for param in params) for params in partition]
        shares = ranks if shares is None else [a + b for a, b in zip(shares, ranks, strict=True)]
    return shares
