"""ZeRO-1: each data-parallel rank keeps the optimizer state of its share of the parameters only.

Plain DDP keeps a whole optimizer state on every rank: with Adam, two float32 tensors the size of
each parameter, twice the parameters' own memory. ZeRO stage 1 (Rajbhandari et al., 2020, "ZeRO:
Memory Optimizations Toward Training Trillion Parameter Models", https://arxiv.org/abs/1910.02054)
partitions that state: each rank steps its share of the parameters and broadcasts the updated
values to the others. torch's ``ZeroRedundancyOptimizer`` does it: it assigns whole parameter
tensors to ranks, largest first, each to the rank with the fewest elements so far, so a rank's
share is about ``1 / world_size`` of the state only when no single tensor dominates (the CNN's
first fully connected layer holds 71% of its parameters, so one rank keeps 71% of the state on
any world size: engine/docs/distributed.md has the figures).

Gradients are still AllReduced whole on every rank (ZeRO-1 shards the state only), and the step
is the same arithmetic per parameter, so a sharded run trains to the parameters of a plain one.
"""

import inspect
from collections.abc import Sequence

import torch
from lightning.pytorch.utilities.types import LRSchedulerConfig
from torch.distributed.optim import ZeroRedundancyOptimizer

from ddp_engine.core.compat import retarget_lr_scheduler
from ddp_engine.core.errors import ConfigValueError


def shard_optimizer(
    optimizer: torch.optim.Optimizer, schedulers: Sequence[LRSchedulerConfig]
) -> ZeroRedundancyOptimizer:
    """``optimizer`` rebuilt as a ``ZeroRedundancyOptimizer`` over the default process group, with
    the same class, defaults and parameter groups (their learning rates and the keys a scheduler
    set in them included); the ``schedulers`` of ``optimizer`` are moved onto it, so that they keep
    scheduling the rates the optimizer steps with. ``optimizer`` must not have stepped yet (its
    state would be lost): Lightning's ``setup_optimizers``, before a checkpoint's state is loaded.

    Raises:
        ConfigValueError: when ``optimizer`` already holds state, or one of its schedulers drives
            others (``SequentialLR``, ``ChainedScheduler``), whose inner schedulers would keep
            the old optimizer.
    """
    if isinstance(optimizer, ZeroRedundancyOptimizer):
        return optimizer
    if optimizer.state:
        raise ConfigValueError(
            f"strategy.optimizer_sharding=true: the {type(optimizer).__name__} already holds state; "
            "it can be sharded only before its first step."
        )
    mine = [config for config in schedulers if config.scheduler.optimizer is optimizer]
    for config in mine:
        if isinstance(
            config.scheduler, torch.optim.lr_scheduler.SequentialLR | torch.optim.lr_scheduler.ChainedScheduler
        ):
            raise ConfigValueError(
                f"strategy.optimizer_sharding=true does not support a {type(config.scheduler).__name__} schedule "
                "(its inner schedulers keep the unsharded optimizer): use one scheduler, or optimizer_sharding=false."
            )
    # Copies of the groups: the new optimizer's must not alias the old one's dicts.
    groups = [dict(group) for group in optimizer.param_groups]
    # The defaults the class's constructor takes: an optimizer may record more than it accepts
    # (AdamW's defaults hold Adam's decoupled_weight_decay); the groups carry every key anyway.
    accepted = inspect.signature(type(optimizer)).parameters
    defaults = {key: value for key, value in optimizer.defaults.items() if key in accepted}
    sharded = ZeroRedundancyOptimizer(groups, optimizer_class=type(optimizer), **defaults)
    for config in mine:
        retarget_lr_scheduler(config.scheduler, sharded)
    return sharded


def drop_duplicate_state(optimizer: ZeroRedundancyOptimizer) -> None:
    """After ``optimizer.load_state_dict``: drop the copy of this rank's entries that the wrapper's
    own ``state`` took, keeping the local optimizer's (``optimizer.optim.state``), which steps.

    torch's ``ZeroRedundancyOptimizer.load_state_dict`` copies this rank's entries to the
    parameters' device for its local optimizer, then calls ``Optimizer.load_state_dict``, which
    casts them to that device again for the wrapper: on a GPU, a second copy of the shard (on the
    CPU both alias the loaded tensors). The wrapper's entries are not used by ``step``, and
    ``state_dict`` takes every entry from the consolidated local states, so nothing is lost.
    """
    optimizer.state.clear()
