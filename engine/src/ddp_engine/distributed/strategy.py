"""Lightning's DDP strategy with gradient communication hooks that run on every backend.

A communication hook replaces DDP's plain AllReduce of each gradient bucket: fp16 / bf16
compression halves the bytes sent, PowerSGD sends a low-rank approximation (Vogels et al., 2019,
https://arxiv.org/abs/1905.13727). Lightning's ``DDPStrategy`` registers ``ddp_comm_hook`` only
when the root device is CUDA, so on CPU (gloo) a configured hook would silently not run; this
strategy registers it itself, on CUDA and CPU alike.

With ``optimizer_sharding`` the configured optimizer is replaced by torch's
``ZeroRedundancyOptimizer`` (ZeRO-1, :mod:`ddp_engine.distributed.zero`): each rank keeps the
optimizer state of its share of the parameters only.
"""

import inspect
from collections.abc import Mapping
from contextlib import nullcontext
from typing import Any

import lightning as L
import torch
import torch.distributed as dist
from lightning.pytorch.strategies import DDPStrategy
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.nn import Module
from torch.nn.parallel import DistributedDataParallel
from typing_extensions import override

from ddp_engine.core.compat import release_consolidated_state
from ddp_engine.core.errors import ConfigValueError
from ddp_engine.distributed.options import CommHook
from ddp_engine.distributed.zero import drop_duplicate_state, shard_optimizer

#: Backends on which every hook below has been run by this project's tests (gloo) or is
#: documented by torch (nccl). Other backends are refused when a hook is configured.
HOOK_BACKENDS = ("gloo", "nccl")
#: The arguments ``DDPStrategy`` takes for itself; it passes the others to ``DistributedDataParallel``.
DDP_STRATEGY_ARGUMENTS = frozenset(inspect.signature(DDPStrategy.__init__).parameters) - {"self", "kwargs"}


class CommHookDDPStrategy(DDPStrategy):
    """``lightning.pytorch.strategies.DDPStrategy`` plus a communication hook chosen by name.

    Args:
        comm_hook: ``none`` (default: plain AllReduce), ``fp16`` or ``bf16`` (each bucket is cast
            to 16 bits for the AllReduce, then back: torch's ``fp16_compress_hook`` /
            ``bf16_compress_hook``), or ``powersgd`` (torch's ``powerSGD_hook``).
        powersgd_rank: PowerSGD ``matrix_approximation_rank`` (default 1): rank of the gradient
            approximation; higher is more exact and sends more.
        powersgd_start_iter: PowerSGD ``start_powerSGD_iter`` (default 10): iterations of plain
            AllReduce before compression starts; at least 2 (torch's rule, with error feedback).
        optimizer_sharding: ZeRO-1 (default False): each configured optimizer is rebuilt as torch's
            ``ZeroRedundancyOptimizer`` (:func:`~ddp_engine.distributed.zero.shard_optimizer`), its
            learning-rate schedulers moved onto it. Checkpoints hold the whole optimizer state,
            consolidated on rank 0 (Lightning's ``Strategy.optimizer_state``), and load on any
            world size (each rank takes its new share).
        **kwargs: passed on to ``DDPStrategy``: its own options (``process_group_backend``,
            ``timeout``, ``start_method``) and ``DistributedDataParallel``'s
            (``find_unused_parameters``, ``static_graph``, ``gradient_as_bucket_view``,
            ``bucket_cap_mb``, ``broadcast_buffers``; passed as ``forward_sync_buffers`` where torch
            has that name).

    Raises:
        ConfigValueError: for an unknown hook name, ``bucket_cap_mb <= 0``, ``powersgd_rank < 1``,
            ``powersgd_start_iter < 2``, a hook with a forced backend other than gloo or nccl, or
            Lightning's own hook arguments (``ddp_comm_hook``, ``ddp_comm_state``, ``ddp_comm_wrapper``).
    """

    def __init__(
        self,
        comm_hook: str = "none",
        powersgd_rank: int = 1,
        powersgd_start_iter: int = 10,
        optimizer_sharding: bool = False,
        **kwargs: Any,
    ) -> None:
        # torch 2.13 renamed DDP's broadcast_buffers (sync buffers before each forward) to
        # forward_sync_buffers and warns on the old name; the config keeps the name every torch knows.
        if (
            "broadcast_buffers" in kwargs
            and "forward_sync_buffers" in inspect.signature(DistributedDataParallel).parameters
        ):
            kwargs["forward_sync_buffers"] = kwargs.pop("broadcast_buffers")
        lightnings_hook = [key for key in ("ddp_comm_hook", "ddp_comm_state", "ddp_comm_wrapper") if key in kwargs]
        if lightnings_hook:  # registered by the configure_ddp of DDPStrategy, which this one replaces
            raise ConfigValueError(
                f"strategy.{lightnings_hook[0]}: this strategy registers its hook by name; use strategy.comm_hook "
                "(none, fp16, bf16, powersgd)."
            )
        super().__init__(**kwargs)
        #: ``DistributedDataParallel``'s keyword arguments: those ``DDPStrategy`` does not name (as it
        #: sorts them itself), kept here because it has no public accessor for them.
        self.ddp_options = {key: value for key, value in kwargs.items() if key not in DDP_STRATEGY_ARGUMENTS}
        try:
            self.comm_hook = CommHook(comm_hook)
        except ValueError:
            allowed = ", ".join(hook.value for hook in CommHook)
            raise ConfigValueError(f"strategy.comm_hook={comm_hook} is not one of: {allowed}.") from None
        bucket_cap_mb = kwargs.get("bucket_cap_mb")
        if bucket_cap_mb is not None and not bucket_cap_mb > 0:  # torch takes any number, and bucket 0 or -1 MiB
            raise ConfigValueError(
                f"strategy.bucket_cap_mb={bucket_cap_mb:g} must be a positive size in MiB (torch's default: 25)."
            )
        if powersgd_rank < 1:
            raise ConfigValueError(f"strategy.powersgd_rank={powersgd_rank} must be at least 1.")
        if powersgd_start_iter < 2:
            raise ConfigValueError(
                f"strategy.powersgd_start_iter={powersgd_start_iter} must be at least 2: DDP runs its first two "
                "iterations with plain AllReduce before PowerSGD's error feedback can start."
            )
        backend = self.process_group_backend
        if self.comm_hook is not CommHook.none and backend is not None and backend not in HOOK_BACKENDS:
            raise ConfigValueError(
                f"strategy.comm_hook={self.comm_hook.value} is supported here on the gloo and nccl backends, "
                f"not on strategy.process_group_backend={backend}. Use comm_hook=none or one of those backends."
            )
        self.powersgd_rank = powersgd_rank
        self.powersgd_start_iter = powersgd_start_iter
        self.optimizer_sharding = optimizer_sharding

    @override
    def setup_optimizers(self, trainer: L.Trainer) -> None:
        # DDPStrategy.setup calls this once the model is wrapped and the process group exists, and
        # before a checkpoint's optimizer state is loaded: the sharded optimizer gets that state.
        super().setup_optimizers(trainer)
        if self.optimizer_sharding:
            self.optimizers = [shard_optimizer(optimizer, self.lr_scheduler_configs) for optimizer in self.optimizers]

    @override
    def load_optimizer_state_dict(self, checkpoint: Mapping[str, Any]) -> None:
        super().load_optimizer_state_dict(checkpoint)
        for optimizer in self.optimizers:
            if isinstance(optimizer, ZeroRedundancyOptimizer):
                drop_duplicate_state(optimizer)

    @override
    def save_checkpoint(self, checkpoint: dict[str, Any], filepath: Any, storage_options: Any | None = None) -> None:
        super().save_checkpoint(checkpoint, filepath, storage_options=storage_options)
        # Writing the checkpoint consolidated every rank's optimizer state on rank 0: a whole
        # unsharded copy, which torch keeps until the next one. Written, it is freed.
        for optimizer in self.optimizers:
            if isinstance(optimizer, ZeroRedundancyOptimizer):
                release_consolidated_state(optimizer)

    @override
    def configure_ddp(self) -> None:
        """Wrap the LightningModule in ``DistributedDataParallel`` and register the communication
        hook: Lightning's, which registers one only on CUDA, with a hook on CPU too."""
        self.model = self.wrap_model(self.model)
        self.register_comm_hook()

    def wrap_model(self, model: Module) -> DistributedDataParallel:
        """``model`` wrapped in ``DistributedDataParallel`` with :attr:`ddp_options`, as Lightning's
        strategy wraps it: on a side CUDA stream on GPUs (https://pytorch.org/docs/stable/notes/cuda.html#id5)."""
        device_ids = self.determine_ddp_device_ids()
        options = dict(self.ddp_options)
        if dist.get_debug_level() == dist.DebugLevel.DETAIL and dist.get_backend() == "gloo":
            # debug=ddp (TORCH_DISTRIBUTED_DEBUG=DETAIL) wraps the process group in torch's
            # collective checker, and DistributedDataParallel's constructor crashes (SIGSEGV, torch
            # 2.14 on gloo) on a wrapped group. DDP's own AllReduces match on every rank by
            # construction, so DDP gets a plain gloo group of its own; every other collective
            # (Lightning's, the metrics', the user's) still goes through the checked default group.
            level = dist.get_debug_level()
            dist.set_debug_level(dist.DebugLevel.INFO)  # new groups are wrapped only under DETAIL
            try:
                options["process_group"] = dist.new_group(backend="gloo")
            finally:
                dist.set_debug_level(level)
        stream = torch.cuda.stream(torch.cuda.Stream()) if device_ids is not None else nullcontext()
        with stream:
            return DistributedDataParallel(module=model, device_ids=device_ids, **options)

    def register_comm_hook(self) -> None:
        """Register :attr:`comm_hook` on the wrapped model (none: DDP's plain AllReduce)."""
        if self.comm_hook is CommHook.none:
            return
        if self.comm_hook is CommHook.powersgd:
            state = powerSGD_hook.PowerSGDState(
                process_group=None,
                matrix_approximation_rank=self.powersgd_rank,
                start_powerSGD_iter=self.powersgd_start_iter,
            )
            self.model.register_comm_hook(state, powerSGD_hook.powerSGD_hook)
        else:
            self.model.register_comm_hook(None, COMPRESS_HOOKS[self.comm_hook])

    @property
    def comm_hook_name(self) -> str:
        """DDP's name of the hook :meth:`register_comm_hook` registers (``none`` without one):
        the name ``ddp.json`` records as ``comm_hook``."""
        if self.comm_hook is CommHook.none:
            return "none"
        if self.comm_hook is CommHook.powersgd:
            return powerSGD_hook.powerSGD_hook.__name__
        return COMPRESS_HOOKS[self.comm_hook].__name__


#: torch's hooks that cast each bucket to 16 bits for the AllReduce.
COMPRESS_HOOKS = {CommHook.fp16: default_hooks.fp16_compress_hook, CommHook.bf16: default_hooks.bf16_compress_hook}
