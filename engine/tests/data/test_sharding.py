"""The training sampler's position inside an epoch, in one process: the same global batches on
every world size, and a resumed epoch that continues at the next one (ddp_engine.data.sharding)."""

import pytest
import torch
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset, default_convert

from ddp_engine.core.errors import ConfigValueError
from ddp_engine.data.sharding import ResumableDataLoader, ResumableDistributedSampler

N, GLOBAL_BATCH = 1008, 48


def global_batches(world_size: int, start: int = 0, epoch: int = 0) -> list[set[int]]:
    """The epoch's global batches (sets of sample indices) when ``world_size`` ranks each take
    ``GLOBAL_BATCH / world_size`` per step, from global sample ``start``."""
    per_rank = []
    for rank in range(world_size):
        sampler = ResumableDistributedSampler(range(N), num_replicas=world_size, rank=rank, seed=7)
        sampler.set_epoch(epoch)
        sampler.start = start
        indices = list(sampler)
        batch = GLOBAL_BATCH // world_size
        per_rank.append([indices[i : i + batch] for i in range(0, len(indices), batch)])
    return [set().union(*step) for step in zip(*per_rank)]


@pytest.mark.parametrize("world_size", [1, 2, 3, 4, 6])
def test_the_kth_global_batch_is_the_same_samples_on_every_world_size(world_size):
    assert global_batches(world_size) == global_batches(1)
    # torch's own sampler deals the same shards: only the start position is added.
    for rank in range(world_size):
        ours = ResumableDistributedSampler(range(N), num_replicas=world_size, rank=rank, seed=7)
        torchs = DistributedSampler(range(N), num_replicas=world_size, rank=rank, shuffle=True, seed=7, drop_last=True)
        assert list(ours) == list(torchs)


@pytest.mark.parametrize(("saved_by", "resumed_by"), [(4, 2), (2, 3), (3, 3)])
def test_a_resumed_epoch_continues_at_the_next_global_batch(saved_by, resumed_by):
    done = 7  # global batches trained before the checkpoint
    resumed = global_batches(resumed_by, start=done * GLOBAL_BATCH)
    assert global_batches(saved_by)[:done] + resumed == global_batches(1)
    # Each sample once in the epoch; the sampler's length stays the whole shard (Lightning counts
    # the epoch's batches by it).
    assert sorted(i for batch in global_batches(saved_by)[:done] + resumed for i in batch) == list(range(N))
    assert len(ResumableDistributedSampler(range(N), num_replicas=resumed_by, rank=0)) == N // resumed_by


def test_the_loader_saves_its_position_and_the_next_epoch_starts_afresh():
    dataset = TensorDataset(torch.arange(N))
    sampler = ResumableDistributedSampler(dataset, num_replicas=2, rank=1, seed=7)
    trained = {"batches": 0}
    loader = ResumableDataLoader(
        dataset, sampler=sampler, batch_size=24, collate_fn=default_convert,
        trained_batches=lambda: trained["batches"], global_batch_size=GLOBAL_BATCH,
    )  # fmt: skip
    sampler.set_epoch(3)
    trained["batches"] = 5
    state = loader.state_dict()
    assert state == {"epoch": 3, "samples": 5 * 48, "global_batch_size": 48}

    fresh = ResumableDistributedSampler(dataset, num_replicas=2, rank=1, seed=7)
    restored = ResumableDataLoader(dataset, sampler=fresh, batch_size=24, collate_fn=default_convert,
                                   trained_batches=lambda: 0, global_batch_size=GLOBAL_BATCH)  # fmt: skip
    restored.load_state_dict(state)
    fresh.set_epoch(3)  # Lightning sets the epoch again when the resumed epoch starts: the position stays
    assert list(fresh) == list(sampler)[5 * 24 :]
    fresh.set_epoch(4)
    assert fresh.start == 0 and len(list(fresh)) == N // 2
    with pytest.raises(ConfigValueError, match="data.global_batch_size=48, this run has 96"):
        ResumableDataLoader(dataset, sampler=fresh, batch_size=48, trained_batches=lambda: 0,
                            global_batch_size=96).load_state_dict(state)  # fmt: skip
    # Lightning's overfit_batches replaces the sampler: no position to save, nothing to restore.
    plain = ResumableDataLoader(dataset, batch_size=24, trained_batches=lambda: 0, global_batch_size=GLOBAL_BATCH)
    assert plain.state_dict() == {} and plain.load_state_dict(state) is None
    assert isinstance(plain, DataLoader)
