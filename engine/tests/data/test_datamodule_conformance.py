"""The conformance check (ddp_engine.data.conformance) on real gloo processes: a DataModule of one's
own on the engine's base passes on 2 and 3 processes with the counts the sharding implies, and
DataModules that each break one guarantee fail with a message that names it.

The DataModules are engine/tests/custom_datamodules.py's. The faulty ones are checked on 2 processes
only: the check stops at the first world size that fails.
"""

import pytest
import torch
from custom_datamodules import DUPLICATES, TensorDataModule

from ddp_engine.core.errors import UsageError
from ddp_engine.data.conformance import ConformanceError, check_conformance, sample_ids

pytestmark = [pytest.mark.processes, pytest.mark.timeout(300)]


def own(name: str, **arguments) -> dict:
    """The ``data`` node of a DataModule of custom_datamodules.py."""
    return {"_target_": f"custom_datamodules.{name}", **arguments}


def assert_counts(report, train: int, val: int, test: int, world_sizes=(2, 3), global_batch_size: int = 12) -> None:
    """What a conforming DataModule shows: each epoch trains the split less its remainder modulo W in
    global batches of ``global_batch_size``, and every evaluation sees its whole split."""
    assert report.split_sizes == {"train": train, "val": val, "test": test}
    assert report.global_batch_size == global_batch_size
    assert list(report.world_sizes) == list(world_sizes)
    for size, seen in report.world_sizes.items():
        trained = train - train % size
        assert seen.trained_per_epoch == (trained, trained), size
        assert seen.left_out_per_epoch == (train % size, train % size), size
        assert seen.steps_per_epoch == (-(-trained // global_batch_size),) * 2, size
        assert seen.evaluated == {"validation of epoch 0": val, "validation of epoch 1": val, "test": test}, size
    # Each resume compares every global batch from the resume step to the end of the second epoch.
    steps = report.world_sizes[world_sizes[0]].steps_per_epoch
    compared = sum(steps) - report.resume_step
    assert report.resume_step == steps[0] // 2
    assert report.world_sizes[world_sizes[0]].resumed == {world_sizes[0]: compared}
    assert report.world_sizes[world_sizes[1]].resumed == {world_sizes[1]: compared, world_sizes[0]: compared}


def test_a_datamodule_of_ones_own_conforms():
    # Its train split holds 5 samples twice: equal windows and targets, which the check must count twice.
    data = TensorDataModule()
    data.setup("fit")
    windows, targets = zip(*(data.train_set[index] for index in range(len(data.train_set))))
    assert len(set(sample_ids(torch.stack(windows), torch.stack(targets)))) == 245 - DUPLICATES == 240
    report = check_conformance(own("TensorDataModule"))
    # 245 samples (5 of them twice: the check counts equal samples as a multiset) leave 1 out on 2
    # processes and 2 on 3; 61 and 47 evaluation samples divide by neither.
    assert_counts(report, train=245, val=61, test=47)


def test_training_on_the_whole_set_on_every_rank_fails():
    with pytest.raises(ConformanceError) as failure:
        check_conformance(own("WholeSetOnEveryRank"), world_sizes=(2,))
    # Both ranks train all 245 samples: 245 trainings too many.
    assert str(failure.value) == (
        "training: 245 samples were trained more than once in epoch 0 on world_size=2: each rank must train its own "
        "shard of train_set (ShardedDataModule.train_dataloader, a DistributedSampler)."
    )
    assert isinstance(failure.value, UsageError)


def test_padded_validation_fails():
    with pytest.raises(ConformanceError) as failure:
        check_conformance(own("PaddedValidation"), world_sizes=(2,))
    # 61 samples on 2 ranks: torch's DistributedSampler pads the second shard with the first sample.
    assert str(failure.value) == (
        "val: 1 sample was evaluated more than once in the validation of epoch 0 on world_size=2 (padding?): "
        "evaluation needs each sample on exactly one rank (ShardedDataModule.val_dataloader: unrepeated_loader)."
    )


def test_a_resume_that_restarts_the_epoch_fails():
    with pytest.raises(ConformanceError) as failure:
        check_conformance(own("NotResumable"), world_sizes=(2,), resume_step=5)
    # 244 of the 245 samples in 21 global batches of 12 per epoch: after step 5, 16 more in epoch 0 and 21
    # in epoch 1. The resumed epoch 0 starts its shards over (its batches 5..20 train the uninterrupted
    # run's 0..15); epoch 1 is a new permutation, the same in both runs.
    assert str(failure.value) == (
        "resume: after resuming at step 5 on world_size=2 the run trained other samples than the uninterrupted "
        "run: 16 of 37 global batches from step 5 on differ, the first at step 5 of epoch 0: the training loader "
        "must continue the epoch where the checkpoint left it (ShardedDataModule.state_dict / "
        "load_state_dict, ResumableDataLoader)."
    )


def test_a_failing_rank_ends_the_check_with_its_error():
    with pytest.raises(ConformanceError, match=r"failed on world_size=2, rank 1: ValueError: no data for rank 1"):
        check_conformance(own("FailsOnRankOne"), world_sizes=(2,), timeout=120)


def test_an_order_that_another_fit_does_not_repeat_fails():
    with pytest.raises(ConformanceError) as failure:
        check_conformance(own("ShufflesAnewEachFit"), world_sizes=(2,))
    # 21 global batches per epoch: the interrupted fit stops after step 10 (half the epoch).
    assert str(failure.value) == (
        "resume: a second fit on world_size=2 trained other samples than the first in its first 10 global batches "
        "(10 differ, the first at step 0 of epoch 0): the training order must be the same in every fit of a seed "
        "(a DistributedSampler with seed=shuffle_seed), or a resume cannot continue it."
    )


def test_global_batches_that_depend_on_the_world_size_fail():
    with pytest.raises(ConformanceError) as failure:
        check_conformance(own("PermutesByWorldSize"))
    # 244 and 243 of the 245 samples: 20 full global batches of 12 per epoch on both world sizes.
    assert str(failure.value) == (
        "resume: world_size=3 trains other global batches than world_size=2 (40 of 40 differ, the first at step 0 "
        "of epoch 0): a checkpoint resumed on another world size would continue in another order; each global "
        "batch must be the same samples whatever the world size (one permutation per epoch, dealt to the ranks in "
        "turn: ResumableDistributedSampler)."
    )
