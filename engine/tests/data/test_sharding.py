"""The training sampler's position inside an epoch, in one process: the same global batches on
every world size, and a resumed epoch that continues at the next one; and evaluation's unpadded
shards: every sample on exactly one rank (ddp_engine.data.sharding)."""

import pytest
import torch
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset, default_convert

from ddp_engine.core.errors import ConfigValueError
from ddp_engine.data.sharded import unrepeated_loader
from ddp_engine.data.sharding import ResumableDataLoader, ResumableDistributedSampler, UnpaddedDistributedSampler

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


#: (world size, data set size): each world size 1..4 with sizes below, at and around it and its
#: multiples, divisible and not.
UNPADDED_CASES = [
    (world_size, size)
    for world_size in (1, 2, 3, 4)
    for size in sorted({0, 1, world_size - 1, world_size, world_size + 1, 2 * world_size - 1, 2 * world_size + 1, 10})
]


@pytest.mark.parametrize(("world_size", "size"), UNPADDED_CASES)
def test_evaluation_gives_every_sample_to_exactly_one_rank_in_order(world_size, size):
    if 0 < size < world_size:
        refused = f"{size} samples? cannot be shared by {world_size} processes .* run on at most {size} process(es)? "
        with pytest.raises(ConfigValueError, match=refused):
            UnpaddedDistributedSampler(range(size), num_replicas=world_size, rank=0)
        return
    samplers = [
        UnpaddedDistributedSampler(range(size), num_replicas=world_size, rank=rank) for rank in range(world_size)
    ]
    shards = [list(sampler) for sampler in samplers]
    for rank, (sampler, shard) in enumerate(zip(samplers, shards)):
        assert shard == list(range(rank, size, world_size)), "rank r takes r, r + world_size, ... in order"
        assert len(sampler) == sampler.num_samples == len(shard)
    assert sorted(index for shard in shards for index in shard) == list(range(size)), "each sample exactly once"
    assert max(map(len, shards)) - min(map(len, shards)) <= 1


def test_the_unpadded_shards_are_those_of_lightnings_sampler_that_the_engine_used():
    # Lightning's class is in its internal overrides package: compared while it is there.
    lightning_class = getattr(
        pytest.importorskip("lightning.pytorch.overrides.distributed"), "UnrepeatedDistributedSampler", None
    )
    if lightning_class is None:
        pytest.skip("Lightning no longer has UnrepeatedDistributedSampler")
    for world_size, size in UNPADDED_CASES:
        if 0 < size < world_size:  # both refuse it, Lightning's with a bare assertion (on the ranks left empty)
            with pytest.raises(AssertionError):
                lightning_class(range(size), num_replicas=world_size, rank=world_size - 1, shuffle=False)
            continue
        for rank in range(world_size):
            ours = UnpaddedDistributedSampler(range(size), num_replicas=world_size, rank=rank)
            lightnings = lightning_class(range(size), num_replicas=world_size, rank=rank, shuffle=False)
            assert list(ours) == list(lightnings), (world_size, size, rank)
            assert (len(ours), ours.total_size) == (len(lightnings), lightnings.total_size), (world_size, size, rank)


def test_the_unpadded_loader_is_a_distributed_sampler_that_no_epoch_reorders():
    # A DistributedSampler: Lightning leaves it in place, and calls its set_epoch.
    loaders = [unrepeated_loader(TensorDataset(torch.arange(11)), 3, rank, batch_size=2) for rank in range(3)]
    assert all(isinstance(loader.sampler, DistributedSampler) for loader in loaders)
    loaders[1].sampler.set_epoch(5)
    batches = [[batch[0].tolist() for batch in loader] for loader in loaders]
    assert batches == [[[0, 3], [6, 9]], [[1, 4], [7, 10]], [[2, 5], [8]]]
    with pytest.raises(ValueError):  # DistributedSampler's check of the rank
        UnpaddedDistributedSampler(range(11), num_replicas=3, rank=3)
