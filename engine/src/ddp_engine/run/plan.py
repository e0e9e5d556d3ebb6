"""``python -m <package>.plan [training overrides]``: the layout of a training on a cluster, planned
on one machine without its GPUs, before the cluster is booked.

The command line is the training's, checked as the training checks it for that layout (a global
batch that does not split is the same one-line refusal). Then this process runs one optimizer step
of the training's model, on its DataModule's shard, with its strategy, as ``plan.global_rank`` of
the planned world size over torch's fake process group (:mod:`ddp_engine.distributed.fake_rank`),
and prints what each device holds (its parameters, gradients, DDP buckets, optimizer state with and
without ZeRO-1, and activations at the per-device batch), against the device's memory, and what each
step's AllReduce moves and takes at ``plan.network_gbps``. A layout that does not start fails in
that step; one that does not fit the device is refused in one line, after the table.
"""

import logging
import sys
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lightning as L
import torch.distributed as dist
from hydra.utils import get_class, instantiate
from lightning.fabric.utilities.rank_zero import rank_zero_only as fabric_rank_zero_only
from lightning.pytorch.utilities.rank_zero import rank_zero_only
from omegaconf import DictConfig, OmegaConf

from ddp_engine.callbacks.ddp_report import allreduce_bytes, ring_sent_bytes
from ddp_engine.callbacks.planned_step import PlannedStep, StepFigures
from ddp_engine.core.compat import init_fake_process_group
from ddp_engine.core.errors import ConfigValueError, UsageError, first_line
from ddp_engine.core.files import write_json
from ddp_engine.core.run_dir import METRICS_FILE
from ddp_engine.distributed.device_memory import device_memory_gib
from ddp_engine.distributed.fake_rank import FakeRankStrategy, PlannedRank
from ddp_engine.distributed.footprint import storage_bytes
from ddp_engine.distributed.layout import CUDA_ONLY_PRECISIONS
from ddp_engine.distributed.layout_rules import per_device_batch_size, planned_world_size, scale_learning_rate
from ddp_engine.distributed.options import LRScaling
from ddp_engine.distributed.strategy import CommHookDDPStrategy
from ddp_engine.models.build import build_model
from ddp_engine.models.optimization import optimizer_lr

log = logging.getLogger(__name__)

GIB = 2**30


def plan(cfg: DictConfig) -> dict:
    """Plan the training ``cfg`` describes (its ``trainer.num_nodes`` x ``trainer.devices`` processes)
    and print the plan's table.

    Returns:
        ``{"plan": <the table's figures>}`` (bytes, seconds; null where not known), which the job
        records in its ``metrics.json``.

    Raises:
        UsageError: a layout whose first step fails (its error, as one line).
        SystemExit: 1, for a layout whose figures exceed the device's memory: ``Error: <what would
            fit>`` on stderr, after the table, and the figures in ``metrics.json`` (``status: refused``).
    """
    trainer = cfg.trainer
    world_size = planned_world_size(trainer.accelerator, trainer.devices, trainer.num_nodes)
    devices_per_node = world_size // trainer.num_nodes
    per_device = per_device_batch_size(cfg.data.global_batch_size, world_size, trainer.accumulate_grad_batches)
    base_lr = optimizer_lr(cfg.model)
    scaling = cfg.lr_scaling
    lr = scale_learning_rate(base_lr, cfg.data.global_batch_size, scaling.reference_batch_size, scaling.rule)
    if base_lr is not None:
        cfg.model.optimizer.lr = lr  # as the training sets it
    L.seed_everything(cfg.seed, workers=True, verbose=False)
    datamodule = instantiate(cfg.data)
    model = build_model(cfg.model, datamodule)
    strategy = planned_strategy(cfg, devices_per_node)
    step = run_planned_step(cfg, model, datamodule, strategy)
    memory_gib = device_memory_gib(cfg.plan.device, cfg.plan.device_memory_gib)
    figures = PlanFigures.of(cfg, step, model, strategy, world_size, per_device, lr, base_lr, memory_gib)
    print(figures.table(cfg), flush=True)
    result = {"plan": figures.to_dict()}
    try:
        figures.check_fit(cfg)
    except ConfigValueError as refused:
        # The plan's answer, not a failure of it: its figures are kept, and the refusal is the
        # command's one line on stderr, as a refused command line's.
        write_json(Path(cfg.paths.output_dir) / METRICS_FILE, {"status": "refused", "error": str(refused), **result})
        print(f"Error: {refused}", file=sys.stderr, flush=True)
        sys.exit(1)
    return result


def planned_strategy(cfg: DictConfig, devices_per_node: int) -> FakeRankStrategy:
    """The training's strategy node (its checkpoint IO, its DDP options), built as the strategy of
    ``plan.global_rank`` of ``trainer.num_nodes`` x ``devices_per_node`` processes.

    Raises:
        ConfigValueError: ``strategy._target_`` is not the engine's strategy.
    """
    target = get_class(cfg.strategy._target_)
    if not issubclass(target, CommHookDDPStrategy):
        raise ConfigValueError(
            f"strategy._target_={target.__name__}: a plan runs the engine's strategy "
            f"({CommHookDDPStrategy.__module__}.{CommHookDDPStrategy.__name__}) as one rank; give its options instead."
        )
    environment = PlannedRank(cfg.plan.global_rank, cfg.trainer.num_nodes, devices_per_node)
    node = OmegaConf.merge(cfg.strategy, {"_target_": f"{FakeRankStrategy.__module__}.{FakeRankStrategy.__qualname__}"})
    return instantiate(node, cluster_environment=environment)


def run_planned_step(
    cfg: DictConfig, model: L.LightningModule, datamodule: L.LightningDataModule, strategy: FakeRankStrategy
) -> StepFigures | None:
    """One optimizer step of ``model`` on ``datamodule``'s shard with ``strategy`` (:func:`planned_strategy`)
    and the training's Trainer settings, over torch's fake process group, on this machine's CPU (a
    precision that needs CUDA as bf16-mixed, SyncBatchNorm as the BatchNorm it replaces: the same
    bytes). None where torch has no fake process group: no step.

    Raises:
        UsageError: the step's own, or its other error as one line: the layout does not start.
    """
    environment = strategy.cluster_environment
    world_size = environment.world_size()
    measured = PlannedStep()
    precision = str(cfg.trainer.precision)
    # The data was prepared by the plan's checks (ddp_engine.config.checks.check_data); Lightning's
    # prepare_data would wait on a gloo group of the other ranks, which the fake group has not.
    datamodule.prepare_data = types.MethodType(L.LightningDataModule.prepare_data, datamodule)
    ranks = rank_zero_only.rank, fabric_rank_zero_only.rank  # the Trainer sets them to the planned rank's
    if not init_fake_process_group(cfg.plan.global_rank, world_size):
        return None
    try:
        trainer = instantiate(
            cfg.trainer,
            accelerator="cpu",
            devices=environment.devices_per_node,
            strategy=strategy,
            precision="bf16-mixed" if precision in CUDA_ONLY_PRECISIONS else precision,
            sync_batchnorm=False,
            logger=False,
            callbacks=[measured],
            max_steps=1,
            limit_val_batches=0,
            num_sanity_val_steps=0,
            fast_dev_run=False,
            profiler=None,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            default_root_dir=cfg.paths.output_dir,
        )
        trainer.fit(model, datamodule=datamodule)
    except UsageError:
        raise
    except Exception as error:  # noqa: BLE001 - any failure of the step is the layout's: one line
        raise UsageError(
            f"the planned layout does not start: global rank {cfg.plan.global_rank} of "
            f"world_size={world_size} failed in its first training step: "
            f"{type(error).__name__}: {first_line(error)}"
        ) from None
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
        rank_zero_only.rank, fabric_rank_zero_only.rank = ranks  # this process is the plan's only one
    if measured.figures is None:
        raise UsageError(
            f"the planned layout took no optimizer step: global rank {cfg.plan.global_rank}'s shard of the "
            "training data holds no batch. Use fewer processes or a smaller data.global_batch_size."
        )
    return measured.figures


@dataclass(frozen=True)
class PlanFigures:
    """The figures of a plan (bytes and seconds; None where not known)."""

    world_size: int
    num_nodes: int
    global_rank: int
    global_batch_size: int
    per_device_batch_size: int
    accumulate_grad_batches: int
    learning_rate: float | None
    base_learning_rate: float | None
    step_ran: bool
    parameters: int
    gradients: int
    ddp_buckets: int
    optimizer_state: int | None
    optimizer_state_zero1: int | None
    optimizer_state_zero1_rank: int | None
    activations: int | None
    activations_batch_size: int | None
    device_memory: int | None
    bucket_count: int | None
    allreduce_bytes_per_step: int | None
    allreduce_sent_bytes_per_rank: int | None
    allreduce_seconds: float | None
    step_seconds: float | None

    @classmethod
    def of(
        cls,
        cfg: DictConfig,
        step: StepFigures | None,
        model: L.LightningModule,
        strategy: CommHookDDPStrategy,
        world_size: int,
        per_device: int,
        lr: float | None,
        base_lr: float | None,
        memory_gib: float | None,
    ) -> "PlanFigures":
        """The figures from the planned ``step`` (None: no step ran, and the tensors are counted from
        ``model``'s parameters: DDP's buckets hold each gradient once, the optimizer state and the
        activations are not known)."""
        if step is not None:
            tensors, buckets = step.tensors, step.bucket_sizes
            parameters, gradients, ddp_buckets = tensors.parameters, tensors.gradients, tensors.ddp_buckets
            state, activations, batch = step.optimizer_state_unsharded, step.activations, step.batch_size
            if step.optimizer_state_zero is not None:
                zero1 = max(step.optimizer_state_zero)
                zero1_rank = step.optimizer_state_zero.index(zero1)
            else:  # a sharded run: this rank's share is what it holds
                zero1 = tensors.optimizer_state if state is None else None
                zero1_rank = cfg.plan.global_rank if state is None else None
        else:
            parameters = storage_bytes(model.parameters())
            gradients = storage_bytes(p for p in model.parameters() if p.requires_grad)
            ddp_buckets = 0 if cfg.strategy.get("gradient_as_bucket_view") else gradients
            buckets, state, activations, batch, zero1, zero1_rank = None, None, None, None, None, None
        payload = allreduce_bytes(buckets if buckets is not None else [gradients], strategy.comm_hook_name)
        sent = None if payload is None else ring_sent_bytes(payload, world_size)
        gbps = cfg.plan.network_gbps
        return cls(
            world_size=world_size,
            num_nodes=cfg.trainer.num_nodes,
            global_rank=cfg.plan.global_rank,
            global_batch_size=cfg.data.global_batch_size,
            per_device_batch_size=per_device,
            accumulate_grad_batches=cfg.trainer.accumulate_grad_batches,
            learning_rate=lr,
            base_learning_rate=base_lr,
            step_ran=step is not None,
            parameters=parameters,
            gradients=gradients,
            ddp_buckets=ddp_buckets,
            optimizer_state=state,
            optimizer_state_zero1=zero1,
            optimizer_state_zero1_rank=zero1_rank,
            activations=activations,
            activations_batch_size=batch,
            device_memory=None if memory_gib is None else round(memory_gib * GIB),
            bucket_count=None if buckets is None else len(buckets),
            allreduce_bytes_per_step=payload,
            allreduce_sent_bytes_per_rank=sent,
            allreduce_seconds=None if sent is None or gbps is None else sent * 8 / (gbps * 1e9),
            step_seconds=cfg.plan.step_seconds,
        )

    def total(self, zero1: bool) -> int | None:
        """The bytes each device holds for the model and a step, without or with ZeRO-1 (None: a part not known)."""
        state = self.optimizer_state_zero1 if zero1 else self.optimizer_state
        if state is None or self.activations is None:
            return None
        return self.parameters + self.gradients + self.ddp_buckets + state + self.activations

    def to_dict(self) -> dict[str, Any]:
        """The figures and the two totals, as ``metrics.json`` records them."""
        return {**vars(self), "total": self.total(zero1=False), "total_zero1": self.total(zero1=True)}

    def table(self, cfg: DictConfig) -> str:
        """The plan as the command prints it."""
        devices_per_node = self.world_size // self.num_nodes
        ran = (
            "one training step ran as that rank over torch's fake process group"
            if self.step_ran
            else "no training step ran: torch here has no fake process group, so optimizer state and activations "
            "are not measured and whether the layout starts is not checked"
        )
        lines = [
            f"Plan: {self.num_nodes} nodes x {devices_per_node} devices = world_size {self.world_size}, "
            f"as global rank {self.global_rank} ({ran})",
            f"  global batch {self.global_batch_size} = {self.per_device_batch_size} per device x "
            f"{self.world_size} processes x {self.accumulate_grad_batches} accumulated micro-batches",
        ]
        if self.learning_rate is not None:
            rule = LRScaling(cfg.lr_scaling.rule).value
            lines.append(
                f"  learning rate {self.learning_rate:g} (model.optimizer.lr={self.base_learning_rate:g} tuned at "
                f"reference batch {cfg.lr_scaling.reference_batch_size}, lr_scaling.rule={rule})"
            )
        rows = [
            ("parameters", self.parameters, self.parameters),
            ("gradients", self.gradients, self.gradients),
            ("DDP buckets", self.ddp_buckets, self.ddp_buckets),
            ("optimizer state", self.optimizer_state, self.optimizer_state_zero1),
            (f"activations (batch {self.activations_batch_size or '-'})", self.activations, self.activations),
            ("total", self.total(False), self.total(True)),
        ]
        lines += ["", f"  {'memory per device':<36}{'DDP':>14}{'with ZeRO-1':>14}"]
        lines += [f"  {name:<36}{_size(plain):>14}{_size(zero):>14}" for name, plain, zero in rows]
        if self.device_memory is None:
            lines.append(
                "  (no device memory given: add plan.device=<name> (h100, h200, a100-80gb, l4, ...) or "
                "plan.device_memory_gib=<GiB> for whether it fits)"
            )
        else:
            device = cfg.plan.device if cfg.plan.device_memory_gib is None else "device"
            fits = [_fit(self.total(zero1), self.device_memory) for zero1 in (False, True)]
            lines.append(f"  {f'fits {device} ({_size(self.device_memory)})':<36}{fits[0]:>14}{fits[1]:>14}")
        if self.activations_batch_size is not None and self.activations_batch_size < self.per_device_batch_size:
            lines.append(
                f"  (rank {self.global_rank}'s shard of the training data held {self.activations_batch_size} samples "
                f"for its step, not {self.per_device_batch_size}: activations at that batch)"
            )
        if self.optimizer_state_zero1_rank is not None:
            lines.append(
                f"  (ZeRO-1: the largest rank's share, rank {self.optimizer_state_zero1_rank}'s: torch gives each rank "
                "whole tensors)"
            )
        lines.append("  (not counted: the CUDA context and kernels' workspace, about 0.5-1 GiB per GPU)")
        lines.append("")
        if self.allreduce_bytes_per_step is None:
            lines.append("  AllReduce per step: PowerSGD's bytes depend on each tensor's approximation: not planned")
        else:
            plural = "" if self.bucket_count == 1 else "s"
            buckets = "" if self.bucket_count is None else f" in {self.bucket_count} DDP bucket{plural}"
            at = (
                ""
                if self.allreduce_seconds is None
                else f" = {self.allreduce_seconds * 1e3:.3g} ms at {cfg.plan.network_gbps:g} Gbit/s (plan.network_gbps)"
            )
            lines.append(
                f"  AllReduce per step: {_size(self.allreduce_bytes_per_step)}{buckets}; a ring sends "
                f"2(W-1)/W of it, {_size(self.allreduce_sent_bytes_per_rank)} per rank{at}"
            )
        if self.step_seconds is not None and self.allreduce_seconds is not None:
            lines.append(
                f"  compute per step {self.step_seconds * 1e3:.3g} ms (plan.step_seconds): the AllReduce is "
                f"{self.allreduce_seconds / self.step_seconds:.1%} of it where it does not overlap the backward"
            )
        return "\n".join(lines)

    def check_fit(self, cfg: DictConfig) -> None:
        """Refuse a layout whose device memory the run's total exceeds (its ZeRO-1 total when it shards).

        Raises:
            ConfigValueError: naming the total, the memory and what would fit.
        """
        sharded = bool(cfg.strategy.get("optimizer_sharding"))
        total = self.total(zero1=sharded)
        if self.device_memory is None or total is None or total <= self.device_memory:
            return
        zero1 = self.total(zero1=True)
        way = (
            f"strategy.optimizer_sharding=true (ZeRO-1: {_size(zero1)}) fits"
            if not sharded and zero1 is not None and zero1 <= self.device_memory
            else "a smaller per-device batch (more processes, or a smaller data.global_batch_size with "
            "trainer.accumulate_grad_batches) or a smaller model fits"
        )
        raise ConfigValueError(
            f"the planned layout does not fit: each device holds {_size(total)}, and it has "
            f"{_size(self.device_memory)} (plan.device / plan.device_memory_gib): {way}."
        )


def _size(value: int | None) -> str:
    """Bytes in binary units, ``-`` where not known."""
    if value is None:
        return "-"
    for unit, scale in (("GiB", GIB), ("MiB", 2**20), ("KiB", 2**10)):
        if value >= scale:
            return f"{value / scale:.3g} {unit}"
    return f"{value} B"


def _fit(total: int | None, memory: int) -> str:
    """Whether ``total`` fits in ``memory``, with the share it takes (two significant digits below
    10%, whole percents above: ``0.0031%``, ``45%``, ``3125%``)."""
    if total is None:
        return "-"
    share = 100 * total / memory
    return f"{'yes' if total <= memory else 'NO'} {f'{share:.2g}' if share < 10 else f'{share:.0f}'}%"
