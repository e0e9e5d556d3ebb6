"""A callback that reports the DDP settings in effect, read back from the live objects.

What a config asks for and what a run does can differ (a key Lightning drops, a hook it does
not register on CPU). This report reads each setting from the process group and the
``DistributedDataParallel`` wrapper themselves, so the run directory records what really ran.
"""

import logging
import os
from pathlib import Path

import lightning as L
import torch.distributed as dist
from lightning.pytorch.utilities import rank_zero_only
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.nn import SyncBatchNorm

from ddp_engine.core.compat import ddp_logging_data, process_group_timeout
from ddp_engine.core.files import write_json
from ddp_engine.distributed.footprint import bucket_sizes

log = logging.getLogger(__name__)


class DDPSettingsReport(L.Callback):
    """On global rank 0, write the DDP settings in effect to ``path`` (JSON) and to the log.

    Written when training starts, and again once DDP has rebuilt its gradient buckets (at the
    second training step, in the order gradients became ready in the first), so that
    ``bucket_sizes_bytes`` shows the buckets the run really AllReduces.

    Keys: ``backend``, ``world_size``, ``timeout_s`` (process group timeout, seconds),
    ``master_port`` (rendezvous port), ``comm_hook`` (the registered hook's name, or ``"none"``),
    ``find_unused_parameters``, ``static_graph``, ``gradient_as_bucket_view``,
    ``broadcast_buffers``, ``bucket_cap_mb`` (MiB), ``bucket_sizes_bytes`` (one entry per gradient
    bucket, bytes; a tensor larger than the cap gets a bucket of its own), ``sync_batchnorm``
    (whether the model holds SyncBatchNorm layers), ``optimizer_sharding`` (whether the optimizer
    the Trainer steps is torch's ``ZeroRedundancyOptimizer``: ZeRO-1, ``strategy.optimizer_sharding``),
    ``allreduce_bytes_per_step`` (what each rank
    AllReduces per optimizer step: the buckets' bytes in the hook's dtype, half of them with the
    fp16 / bf16 hooks; null for PowerSGD, whose volume depends on each tensor's shape and the
    rank of its approximation) and ``allreduce_sent_bytes_per_rank`` (what a ring AllReduce, NCCL's
    and gloo's algorithm for large buffers, sends from each rank for it: 2 (W - 1) / W times that,
    W the world size; Patarasuk and Yuan, "Bandwidth optimal all-reduce algorithms for clusters of
    workstations", 2009). Where torch keeps no record of its buckets and hook
    (:func:`~ddp_engine.core.compat.ddp_logging_data`, said once), ``comm_hook``,
    ``bucket_sizes_bytes`` and the two AllReduce figures are null.

    Args:
        path: the JSON file to write (the default config puts it in the run directory as ``ddp.json``).
    """

    def __init__(self, path: str) -> None:
        self.path = Path(path)
        self._buckets_rebuilt = False

    @rank_zero_only
    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        settings = self._write(trainer)
        log.info("DDP settings in effect: " + ", ".join(f"{key}={value}" for key, value in settings.items()))

    @rank_zero_only
    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs, batch, batch_idx) -> None:
        if not self._buckets_rebuilt and ddp_logging_data(trainer.strategy.model).get("has_rebuilt_buckets"):
            self._buckets_rebuilt = True
            settings = self._write(trainer)
            log.info(f"DDP gradient buckets after DDP's rebuild (bytes): {settings['bucket_sizes_bytes']}")

    def _write(self, trainer: L.Trainer) -> dict:
        ddp = trainer.strategy.model  # the DistributedDataParallel wrapper while fitting
        data = ddp_logging_data(ddp)  # empty where torch keeps no such record: the figures are then None
        buckets = bucket_sizes(data)
        timeout = process_group_timeout(trainer.strategy.root_device)
        settings = {
            "backend": dist.get_backend(),
            "world_size": dist.get_world_size(),
            "timeout_s": timeout.total_seconds() if timeout is not None else None,
            "master_port": int(os.environ["MASTER_PORT"]),
            "comm_hook": (data.get("comm_hook") or "none") if data else None,
            "find_unused_parameters": ddp.find_unused_parameters,
            "static_graph": ddp.static_graph,
            "gradient_as_bucket_view": ddp.gradient_as_bucket_view,
            "broadcast_buffers": ddp.broadcast_buffers,
            "bucket_cap_mb": ddp.bucket_bytes_cap / 2**20,
            "bucket_sizes_bytes": buckets,
            "sync_batchnorm": any(isinstance(module, SyncBatchNorm) for module in ddp.module.modules()),
            # The optimizers the strategy really steps (it rebuilds them sharded in setup_optimizers).
            "optimizer_sharding": any(
                isinstance(optimizer, ZeroRedundancyOptimizer) for optimizer in trainer.optimizers
            ),
        }
        payload = None if buckets is None else allreduce_bytes(buckets, settings["comm_hook"])
        settings["allreduce_bytes_per_step"] = payload
        sent = None if payload is None else ring_sent_bytes(payload, settings["world_size"])
        settings["allreduce_sent_bytes_per_rank"] = sent
        write_json(self.path, settings)
        return settings


#: The bytes each hook sends per gradient byte (fp32 gradients): torch's compress hooks cast each
#: bucket to 16 bits for the AllReduce.
HOOK_BYTES_PER_GRADIENT_BYTE = {"none": 1.0, "fp16_compress_hook": 0.5, "bf16_compress_hook": 0.5}


def allreduce_bytes(bucket_sizes: list[int], comm_hook: str) -> int | None:
    """The bytes one rank AllReduces per optimizer step: the gradient buckets (``bucket_sizes``, bytes)
    as the communication hook ``comm_hook`` (DDP's name for it, ``"none"`` without one) sends them;
    None for a hook whose volume is not a fixed share of the buckets (PowerSGD)."""
    share = HOOK_BYTES_PER_GRADIENT_BYTE.get(comm_hook)
    return None if share is None else round(sum(bucket_sizes) * share)


def ring_sent_bytes(payload: int, world_size: int) -> int:
    """What a ring AllReduce of ``payload`` bytes sends from each of ``world_size`` ranks:
    2 (W - 1) / W times the payload (its reduce-scatter, then its all-gather)."""
    return round(2 * (world_size - 1) / world_size * payload)
