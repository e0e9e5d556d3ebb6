"""The folder DataModule (``data=folder``) keeps the engine's guarantees under DDP with augmentation
on: the conformance check (ddp_engine.data.conformance) on real gloo processes, 2 and 3 of them,
shows the counts the sharding implies."""

import pytest

from ddp_engine.data.conformance import check_conformance

pytestmark = [pytest.mark.processes, pytest.mark.timeout(300)]


def test_image_folder_datamodule_conforms_with_augmentation(image_folder, tmp_path):
    data = {"_target_": "ddp_engine.vision.folder.ImageFolderDataModule", "root": str(image_folder),
            "crop_padding": 4, "horizontal_flip": True, "cache_dir": str(tmp_path / "cache")}  # fmt: skip
    report = check_conformance(data)
    # 48 * 5 training images, a tenth of them held out for validation; 14 * 5 test images.
    assert report.split_sizes == {"train": 216, "val": 24, "test": 70}
    assert report.global_batch_size == 12 and list(report.world_sizes) == [2, 3]
    for size, seen in report.world_sizes.items():
        # 216 divides by 2 and 3: every training image, once per epoch, in 18 global batches of 12.
        assert seen.trained_per_epoch == (216, 216) and seen.left_out_per_epoch == (0, 0), size
        assert seen.steps_per_epoch == (18, 18), size
        assert seen.evaluated == {"validation of epoch 0": 24, "validation of epoch 1": 24, "test": 70}, size
    # Each resume compares every global batch from the resume step (half the first epoch) to the end.
    assert report.resume_step == 9
    assert report.world_sizes[2].resumed == {2: 27}
    assert report.world_sizes[3].resumed == {3: 27, 2: 27}
