"""What ZeRO-1's wrapping (:func:`mnist_ddp.distributed.zero.shard_optimizer`) refuses, before it
builds anything: an optimizer that has stepped (its state would be lost), and a schedule whose inner
schedulers would keep the unsharded optimizer. Each refusal is one line naming the key and the fix."""

from types import SimpleNamespace

import pytest
import torch
from torch import nn

from mnist_ddp.core.errors import ConfigValueError
from mnist_ddp.distributed.zero import shard_optimizer


def test_an_optimizer_that_has_stepped_is_refused():
    layer = nn.Linear(3, 1)
    optimizer = torch.optim.Adam(layer.parameters())
    layer(torch.ones(1, 3)).sum().backward()
    optimizer.step()
    with pytest.raises(ConfigValueError, match=r"^strategy.optimizer_sharding=true: the Adam already holds state; "):
        shard_optimizer(optimizer, [])


def test_a_sequential_schedule_is_refused_in_one_line():
    optimizer = torch.optim.SGD(nn.Linear(3, 1).parameters(), lr=0.1)
    inner = [torch.optim.lr_scheduler.ConstantLR(optimizer), torch.optim.lr_scheduler.ExponentialLR(optimizer, 0.9)]
    scheduler = torch.optim.lr_scheduler.SequentialLR(optimizer, inner, milestones=[2])
    with pytest.raises(ConfigValueError) as refused:
        shard_optimizer(optimizer, [SimpleNamespace(scheduler=scheduler)])
    assert str(refused.value) == (
        "strategy.optimizer_sharding=true does not support a SequentialLR schedule (its inner schedulers keep the "
        "unsharded optimizer): use one scheduler, or optimizer_sharding=false."
    )
