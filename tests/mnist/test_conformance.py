"""The conformance check (ddp_engine.data.conformance) on the template's own DataModule, on real gloo
processes: MNIST's passes on 2 and 3 processes with the counts the sharding implies. The check on
DataModules of one's own and on faulty ones is the engine's (engine/tests/data/), on a folder of
images too (engine/tests/vision/).
"""

import pytest
from ddp_engine.data.conformance import check_conformance

pytestmark = [pytest.mark.processes, pytest.mark.timeout(300)]


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


@pytest.mark.task
def test_mnist_datamodule_conforms(synthetic_data_dir):
    data = {"_target_": "mnist_ddp.data.MNISTDataModule", "data_dir": str(synthetic_data_dir),
            "val_size": 200}  # fmt: skip
    report = check_conformance(data)
    # 1,000 training images: all of them on 2 processes, 999 on 3 (one left out each epoch).
    assert_counts(report, train=1000, val=200, test=300)
    assert report.world_sizes[3].left_out_per_epoch == (1, 1)
