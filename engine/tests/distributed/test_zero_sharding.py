"""What ZeRO-1's wrapping (:func:`ddp_engine.distributed.zero.shard_optimizer`) refuses, before it
builds anything: an optimizer that has stepped (its state would be lost), and a schedule whose inner
schedulers would keep the unsharded optimizer. Each refusal is one line naming the key and the fix.
And a loaded state is kept once (:func:`ddp_engine.distributed.zero.drop_duplicate_state`)."""

from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.optim import ZeroRedundancyOptimizer

from ddp_engine.core.errors import ConfigValueError
from ddp_engine.distributed.zero import drop_duplicate_state, shard_optimizer


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


def test_a_loaded_state_is_kept_once_and_gives_back_the_saved_state(tmp_path):
    """A 1-process gloo group: the state a ZeroRedundancyOptimizer loads stays in its local optimizer
    only (on a GPU the wrapper would hold a second copy), and consolidates back to the saved state."""
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'rendezvous'}", rank=0, world_size=1)
    try:
        torch.manual_seed(0)
        layer = nn.Linear(3, 2)
        trained = ZeroRedundancyOptimizer(layer.parameters(), optimizer_class=torch.optim.Adam, lr=0.1)
        layer(torch.ones(1, 3)).sum().backward()
        trained.step()
        trained.consolidate_state_dict()
        saved = trained.state_dict()
        restored = ZeroRedundancyOptimizer(layer.parameters(), optimizer_class=torch.optim.Adam, lr=0.1)
        restored.load_state_dict(saved)
        drop_duplicate_state(restored)
        assert not restored.state and len(restored.optim.state) == 2
        restored.consolidate_state_dict()
        again = restored.state_dict()
        assert again["param_groups"] == saved["param_groups"]
        assert again["state"].keys() == saved["state"].keys() == {0, 1}
        for index, entry in saved["state"].items():
            assert entry.keys() == again["state"][index].keys()
            assert all(torch.equal(value, again["state"][index][key]) for key, value in entry.items())
    finally:
        dist.destroy_process_group()
