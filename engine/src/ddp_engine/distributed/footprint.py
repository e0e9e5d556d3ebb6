"""What a data-parallel replica holds in memory, counted from the tensors themselves.

Every DDP process holds a whole replica: the parameters, their gradients, the gradient buckets
DDP AllReduces, and the optimizer's state (Adam: two tensors the size of each parameter; SGD with
momentum: one). ZeRO-1 (:mod:`ddp_engine.distributed.zero`) shards the last of these. This module
counts the bytes of each, per process, so that the memory figures
(:class:`~ddp_engine.callbacks.memory.MemoryFootprint`) say where a device's memory goes.

Bytes are counted per storage, each once: a gradient that is a view into a DDP bucket
(``gradient_as_bucket_view=true``) counts as that bucket, once; two optimizer-state entries on one
storage count once. A storage's bytes are ``untyped_storage().nbytes()``, what its allocator was
asked for (the CUDA caching allocator rounds each block up to a multiple of 512 bytes, so
``torch.cuda.memory_allocated`` may be slightly larger). Tensors count wherever they live: Adam's
per-tensor step counts (4 bytes each) stay on the CPU on a GPU run unless it is ``capturable``
or ``fused``.
"""

from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch import Tensor, nn
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.nn.parallel import DistributedDataParallel

from ddp_engine.core.compat import ddp_logging_data


@dataclass(frozen=True)
class TensorFootprint:
    """The bytes of one replica's model tensors (bytes, each storage counted once).

    Attributes:
        parameters: the model's parameters.
        gradients: the parameters' ``.grad`` tensors that exist now (None before the first
            backward, or after ``zero_grad(set_to_none=True)``).
        ddp_buckets: DDP's gradient buckets, where they are storage of their own
            (``gradient_as_bucket_view=false``: gradients are copied into them for the AllReduce);
            0 when gradients are views into them (counted in ``gradients`` then) or without DDP.
        optimizer_state: the tensors of the optimizer's ``state`` on this rank (for torch's
            ``ZeroRedundancyOptimizer``: its local optimizer's, this rank's shard, plus any the
            wrapper itself keeps).
    """

    parameters: int
    gradients: int
    ddp_buckets: int
    optimizer_state: int

    @property
    def total(self) -> int:
        """The sum of the four (bytes)."""
        return self.parameters + self.gradients + self.ddp_buckets + self.optimizer_state

    def to_dict(self) -> dict[str, int]:
        """``{"parameters": ..., "gradients": ..., "ddp_buckets": ..., "optimizer_state": ...}`` (bytes)."""
        return asdict(self)


def storage_bytes(tensors: Iterable[Tensor]) -> int:
    """The bytes of the distinct storages under ``tensors``: a storage shared by several tensors
    (views, aliases) counts once. Storages are told apart by device and address."""
    seen: dict[tuple[torch.device, int], int] = {}
    for tensor in tensors:
        storage = tensor.untyped_storage()
        seen[(tensor.device, storage.data_ptr())] = storage.nbytes()
    return sum(seen.values())


def _tensors_in(value: Any) -> Iterator[Tensor]:
    """The tensors in an optimizer state entry: a tensor, or dicts / lists / tuples of them
    (``None`` where ``ZeroRedundancyOptimizer`` keeps no state for another rank's parameter)."""
    if isinstance(value, Tensor):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _tensors_in(item)
    elif isinstance(value, list | tuple):
        for item in value:
            yield from _tensors_in(item)


def optimizer_state_tensors(optimizer: torch.optim.Optimizer) -> list[Tensor]:
    """The tensors of ``optimizer``'s state held by this process. For a ``ZeroRedundancyOptimizer``,
    those of its local optimizer (``optim``: this rank's shard) and those its own ``state`` keeps
    (after a ``load_state_dict``, this rank's entries, which alias the local ones on the same device)."""
    states = [optimizer.state]
    if isinstance(optimizer, ZeroRedundancyOptimizer):
        states.append(optimizer.optim.state)
    return [tensor for state in states for value in state.values() for tensor in _tensors_in(value)]


def ddp_bucket_bytes(ddp: DistributedDataParallel) -> int:
    """The bytes of ``ddp``'s gradient buckets, as DDP records them (after its rebuild at the second
    step, the rebuilt ones; the total is the same: every parameter that gets a gradient, once), or,
    where torch keeps no such record (:func:`~ddp_engine.core.compat.ddp_logging_data`), counted
    from those parameters."""
    sizes = bucket_sizes(ddp_logging_data(ddp))
    if sizes is None:
        return sum(p.numel() * p.element_size() for p in ddp.module.parameters() if p.requires_grad)
    return sum(sizes)


def bucket_sizes(data: dict) -> list[int] | None:
    """The bytes of each gradient bucket in DDP's logging ``data``: the rebuilt buckets once DDP has
    rebuilt them, else the first ones; None where ``data`` holds neither."""
    sizes = data.get("rebuilt_bucket_sizes") if data.get("has_rebuilt_buckets") else data.get("bucket_sizes")
    return None if sizes is None else [int(size) for size in str(sizes).split(",") if size]


def tensor_footprint(
    module: nn.Module, optimizers: Iterable[torch.optim.Optimizer], ddp: DistributedDataParallel | None = None
) -> TensorFootprint:
    """The bytes of ``module``'s parameters and gradients, ``ddp``'s buckets and ``optimizers``' state
    on this process (see :class:`TensorFootprint`).

    Args:
        module: the model (the LightningModule, or the module DDP wraps).
        optimizers: its optimizers (Lightning's ``trainer.optimizers``).
        ddp: the ``DistributedDataParallel`` wrapper of ``module``, if any: its buckets count
            unless gradients are views into them.
    """
    parameters = list(module.parameters())
    gradients = [p.grad for p in parameters if p.grad is not None]
    buckets = 0
    if ddp is not None and not ddp.gradient_as_bucket_view:
        buckets = ddp_bucket_bytes(ddp)
    state = [tensor for optimizer in optimizers for tensor in optimizer_state_tensors(optimizer)]
    return TensorFootprint(
        parameters=storage_bytes(parameters),
        gradients=storage_bytes(gradients),
        ddp_buckets=buckets,
        optimizer_state=storage_bytes(state),
    )


class SavedActivations:
    """Counts the bytes autograd keeps from a forward pass for its backward (the activations),
    each storage once, leaving out ``excluded`` tensors' storages (the parameters, which a layer
    saves too): entered before the forward, exited before the backward; :attr:`bytes` is then the
    count. torch's public ``saved_tensors_hooks`` see every tensor saved."""

    def __init__(self, excluded: Iterable[Tensor] = ()) -> None:
        self._excluded = {(tensor.device, tensor.untyped_storage().data_ptr()) for tensor in excluded}
        self._seen: dict[tuple[torch.device, int], int] = {}
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda tensor: tensor)

    @property
    def bytes(self) -> int:
        return sum(self._seen.values())

    def _pack(self, tensor: Tensor) -> Tensor:
        storage = tensor.untyped_storage()
        key = (tensor.device, storage.data_ptr())
        if key not in self._excluded:
            self._seen[key] = storage.nbytes()
        return tensor

    def __enter__(self) -> "SavedActivations":
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._hooks.__exit__(*exc_info)


def state_bytes_per_parameter(optimizer: torch.optim.Optimizer) -> dict[Tensor, int]:
    """The bytes of ``optimizer``'s state entry of each parameter it holds one of, each storage once
    per entry (a ``ZeroRedundancyOptimizer``'s: this rank's share, its local optimizer's)."""
    state = optimizer.optim.state if isinstance(optimizer, ZeroRedundancyOptimizer) else optimizer.state
    return {param: storage_bytes(_tensors_in(entry)) for param, entry in state.items()}
