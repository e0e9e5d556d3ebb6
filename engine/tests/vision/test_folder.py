"""The folder DataModule (``data=folder``, :mod:`ddp_engine.vision.folder`) on real image files:
what it reads (classes, labels, pixels, the split, the spec), the survey kept in ``cache_dir``
(never in the data folder), the same batches from memory and from disk (in real DataLoader worker
processes) and the same trained parameters, and every bad input refused in one line that names
the file or folder and the fix, once through the real command line.

Ranks are simulated by a stand-in for the Trainer that reports ``world_size`` and ``global_rank``,
and the real DDP runs on a folder are in test_folder_cli.py.
"""

import json
import os
import re
import shutil
from pathlib import Path
from types import SimpleNamespace

import lightning as L
import numpy as np
import pytest
import torch
from harness import run_cli
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate
from PIL import Image
from vision_task.classifier import make_image_folder
from vision_task.task import TASK

import ddp_engine.vision.folder as folder_module
from ddp_engine.config.command_line import check_command_line
from ddp_engine.core.errors import ConfigValueError, DataFormatError, DataNotAvailableError
from ddp_engine.data.sharded import GatherDataset
from ddp_engine.models.build import build_model
from ddp_engine.vision.folder import FolderImages, ImageFolderDataModule

#: The classes of the reading fixture, created in this (unsorted) order.
CLASSES = ("zebra", "apple", "mango")
SIZE = (12, 10)  # (H, W): not square, so that a transposition would show
TRAIN_PER_CLASS, TEST_PER_CLASS = 6, 2
#: How far a JPEG's decoded pixels may be from the pixels it was written from (quality 95, no
#: chroma subsampling, a smooth image); measured 3.
JPEG_TOLERANCE = 6


def pixels_hwc(rng: np.random.Generator, size=SIZE, channels: int = 3) -> np.ndarray:
    """Random uint8 pixels ``(H, W, C)`` (``(H, W)`` for one channel)."""
    shape = (*size, channels) if channels > 1 else size
    return rng.integers(0, 256, shape, dtype=np.uint8)


def write_image(path: Path, pixels: np.ndarray, **options) -> np.ndarray:
    """Save ``pixels`` ``(H, W[, C])`` to ``path`` (PNG or JPEG by its suffix); returns them."""
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(pixels).save(path, **options)
    return pixels


def chw(pixels: np.ndarray) -> torch.Tensor:
    """``(H, W, C)`` numpy -> ``(C, H, W)`` tensor, as the DataModule serves an image."""
    return torch.from_numpy(pixels).permute(2, 0, 1)


@pytest.fixture(scope="module")
def reading(tmp_path_factory) -> tuple[Path, dict[str, np.ndarray]]:
    """A folder data set written here, with every image's pixels by its path under the root:
    3 classes (created unsorted), 6 PNGs each in train/ plus one in a subfolder of zebra/, 2
    PNGs each in test/ plus a ``.jpeg`` and a ``.JPG``; text files beside them. No val/."""
    root = tmp_path_factory.mktemp("reading")
    rng = np.random.default_rng(0)
    written = {}
    for name in CLASSES:
        for i in range(TRAIN_PER_CLASS):
            written[f"train/{name}/img{i}.png"] = write_image(root / f"train/{name}/img{i}.png", pixels_hwc(rng))
        for i in range(TEST_PER_CLASS):
            written[f"test/{name}/t{i}.png"] = write_image(root / f"test/{name}/t{i}.png", pixels_hwc(rng))
    written["train/zebra/more/deep.png"] = write_image(root / "train/zebra/more/deep.png", pixels_hwc(rng))
    rows, columns = np.mgrid[0 : SIZE[0], 0 : SIZE[1]]
    smooth = np.stack([rows * 12 + 40, columns * 14 + 30, rows * 5 + columns * 6 + 60], axis=-1).astype(np.uint8)
    for path, pixels in (("test/apple/photo.jpeg", smooth), ("test/mango/photo.JPG", 255 - smooth)):
        written[path] = write_image(root / path, pixels, format="JPEG", quality=95, subsampling=0)
    (root / "train/apple/notes.txt").write_text("not an image\n")
    (root / "train/README.txt").write_text("a file beside the class folders\n")
    (root / "test/zebra/labels.csv").write_text("t0.png,zebra\n")
    return root, written


#: The order the files are read in: class by class (sorted names), files sorted by their path.
TRAIN_ORDER = [f"train/apple/img{i}.png" for i in range(6)] + [f"train/mango/img{i}.png" for i in range(6)] + [
    f"train/zebra/img{i}.png" for i in range(6)
] + ["train/zebra/more/deep.png"]  # fmt: skip
TEST_ORDER = ["test/apple/photo.jpeg", "test/apple/t0.png", "test/apple/t1.png", "test/mango/photo.JPG",
              "test/mango/t0.png", "test/mango/t1.png", "test/zebra/t0.png", "test/zebra/t1.png"]  # fmt: skip


def on_rank(root: Path, world_size: int = 1, rank: int = 0, **kwargs) -> ImageFolderDataModule:
    """A DataModule on ``root`` in simulated rank ``rank`` of ``world_size``, set up for fit and test."""
    dm = ImageFolderDataModule(str(root), **{"global_batch_size": 2 * world_size, **kwargs})
    dm.trainer = SimpleNamespace(world_size=world_size, global_rank=rank, accumulate_grad_batches=1)
    dm.setup("fit")
    dm.setup("test")
    return dm


def pairs(dataset: GatherDataset) -> list[tuple[bytes, int]]:
    """A split's samples as sorted ``(pixel bytes, label)`` pairs: its content, in no order."""
    images, labels = dataset.tensors
    return sorted((image.numpy().tobytes(), int(label)) for image, label in zip(images, labels))


# Reading.


def test_classes_labels_and_pixels_are_read_exactly(reading):
    root, written = reading
    dm = on_rank(root)
    assert dm.spec.class_names == ("apple", "mango", "zebra"), "train/'s folder names, sorted"
    assert dm.class_names == ["apple", "mango", "zebra"]
    # Subfolders read, text files left out, the order class by class.
    assert sorted(dm.splits) == ["test", "train"]
    assert [path.relative_to(root).as_posix() for path in dm.splits["train"].files] == TRAIN_ORDER
    assert dm.splits["train"].labels == [0] * 6 + [1] * 6 + [2] * 7
    assert [path.relative_to(root).as_posix() for path in dm.splits["test"].files] == TEST_ORDER
    assert dm.splits["test"].labels == [0, 0, 0, 1, 1, 1, 2, 2]
    # The test split as stored: uint8 (N, C, H, W); PNGs exactly the written pixels, JPEGs close to them.
    assert isinstance(dm.test_set, GatherDataset)
    images, labels = dm.test_set.tensors
    assert images.dtype == torch.uint8 and images.shape == (8, 3, *SIZE)
    assert labels.dtype == torch.int64 and labels.tolist() == [0, 0, 0, 1, 1, 1, 2, 2]
    for image, path in zip(images, TEST_ORDER):
        expected = chw(written[path])
        if path.endswith(".png"):
            assert torch.equal(image, expected), path
        else:
            difference = (image.int() - expected.int()).abs().max().item()
            assert 0 < difference <= JPEG_TOLERANCE, (path, difference)
    # Train and val together are train/ exactly, each image with its class's label.
    assert len(dm.train_set) == 17 and len(dm.val_set) == 2, "val_size 0.1 of 19, rounded"
    together = GatherDataset(*(torch.cat(parts) for parts in zip(dm.train_set.tensors, dm.val_set.tensors)))
    assert pairs(together) == sorted(
        (chw(written[path]).numpy().tobytes(), label) for path, label in zip(TRAIN_ORDER, [0] * 6 + [1] * 6 + [2] * 7)
    )


def test_the_split_is_seeded_and_the_same_on_every_rank(reading):
    root, _ = reading
    reference = on_rank(root)
    for world_size, rank in [(2, 1), (3, 2)]:
        dm = on_rank(root, world_size, rank, shuffle_seed=world_size)
        for split in ("train_set", "val_set"):
            for ours, theirs in zip(getattr(dm, split).tensors, getattr(reference, split).tensors):
                assert torch.equal(ours, theirs), (world_size, rank, split)
    again = on_rank(root, split_seed=0)
    assert torch.equal(again.val_set.tensors[0], reference.val_set.tensors[0])
    other = on_rank(root, split_seed=1)
    assert not torch.equal(other.val_set.tensors[0], reference.val_set.tensors[0])
    assert pairs(other.val_set) != pairs(reference.val_set), "other images held out, not only another order"
    # An integer val_size is a count of images.
    counted = on_rank(root, val_size=5)
    assert len(counted.val_set) == 5 and len(counted.train_set) == 14
    assert len(on_rank(root, val_size=0.5).val_set) == 10, "round(19 * 0.5)"


def test_a_val_folder_is_the_validation_split_and_val_size_is_ignored(reading, tmp_path):
    root, written = reading
    shutil.copytree(root, tmp_path / "data")
    rng = np.random.default_rng(1)
    val = {f"val/{name}/v.png": write_image(tmp_path / "data" / f"val/{name}/v.png", pixels_hwc(rng))
           for name in ("zebra", "apple")}  # fmt: skip
    # 1000 would hold out more images than train/ has: refused without val/ (see the refusals), ignored with it.
    dm = on_rank(tmp_path / "data", val_size=1000)
    assert sorted(dm.splits) == ["test", "train", "val"]
    images, labels = dm.val_set.tensors
    assert labels.tolist() == [0, 2]
    assert torch.equal(images, torch.stack([chw(val["val/apple/v.png"]), chw(val["val/zebra/v.png"])]))
    images, labels = dm.train_set.tensors
    assert torch.equal(images, torch.stack([chw(written[path]) for path in TRAIN_ORDER])), "all of train/, in order"
    assert labels.tolist() == [0] * 6 + [1] * 6 + [2] * 7


def test_the_spec_has_the_shape_and_the_training_pixels_mean_and_std(reading):
    root, written = reading
    dm = ImageFolderDataModule(str(root))
    spec = dm.spec
    assert spec.input_shape == (3, *SIZE)
    # Computed over every image of train/ (the held-out validation images too), population std.
    train = np.stack([written[path] for path in TRAIN_ORDER]).astype(np.float64) / 255
    assert spec.mean == pytest.approx(train.mean(axis=(0, 1, 2)).tolist(), abs=1e-12)
    assert spec.std == pytest.approx(train.std(axis=(0, 1, 2)).tolist(), abs=1e-12)
    assert len(set(spec.mean)) == 3, "one value per channel"
    # Given statistics are used instead: one value for every channel, or one per channel.
    given = ImageFolderDataModule(str(root), mean=0.5, std=0.25).spec
    assert given.mean == (0.5, 0.5, 0.5) and given.std == (0.25, 0.25, 0.25)
    given = ImageFolderDataModule(str(root), mean=[0.1, 0.2, 0.3], std=[0.4, 0.5, 0.6]).spec
    assert given.mean == (0.1, 0.2, 0.3) and given.std == (0.4, 0.5, 0.6)
    assert given.class_names == spec.class_names and given.input_shape == spec.input_shape
    # Batches are normalized by the spec: (pixel / 255 - mean) / std per channel.
    pixels = chw(written[TRAIN_ORDER[0]]).unsqueeze(0)
    images, _ = dm.on_after_batch_transfer((pixels, torch.tensor([0])), 0)
    mean, std = (torch.tensor(values, dtype=torch.float32).view(3, 1, 1) for values in (spec.mean, spec.std))
    assert torch.equal(images, (pixels.float() / 255 - mean) / std)


def test_channels_converts_and_image_size_resizes(reading):
    root, written = reading
    gray = on_rank(root, channels=1)
    assert gray.spec.input_shape == (1, *SIZE) and len(gray.spec.mean) == 1
    images, _ = gray.test_set.tensors
    assert images.shape == (8, 1, *SIZE)
    # Pillow's ITU-R 601-2 luma, in its fixed point: L = (19595 R + 38470 G + 7471 B + 2^15) >> 16.
    rgb = written["test/apple/t0.png"].astype(np.int64)
    luma = (rgb[..., 0] * 19595 + rgb[..., 1] * 38470 + rgb[..., 2] * 7471 + 0x8000) >> 16
    assert torch.equal(images[TEST_ORDER.index("test/apple/t0.png"), 0], torch.from_numpy(luma.astype(np.uint8)))
    resized = on_rank(root, image_size=[8, 6])
    assert resized.spec.input_shape == (3, 8, 6)
    assert resized.train_set.tensors[0].shape == (17, 3, 8, 6) and resized.test_set.tensors[0].shape == (8, 3, 8, 6)
    both = on_rank(root, image_size=[16, 16], channels=1, in_memory_limit_mib=0)
    assert both.spec.input_shape == (1, 16, 16)
    assert isinstance(both.test_set, FolderImages) and both.test_set[0][0].shape == (1, 16, 16)


# The survey cache.


def snapshot(folder: Path) -> list[tuple]:
    """Every entry under ``folder`` (itself included): path, kind, size and modification time."""
    entries = []
    for parent, folders, files in os.walk(folder):
        for name in ["", *folders, *files]:
            path = Path(parent) / name
            stat = path.lstat()
            entries.append((str(path.relative_to(folder)), path.is_dir(), stat.st_size, stat.st_mtime_ns))
    return sorted(entries)


def restore_permissions(folder: Path) -> None:
    """Every folder under ``folder`` back to 755 (each before it is entered), every file to 644."""
    os.chmod(folder, 0o755)
    for parent, folders, files in os.walk(folder):
        for name in folders:
            os.chmod(Path(parent) / name, 0o755)
        for name in files:
            os.chmod(Path(parent) / name, 0o644)


def refuse_to_decode(monkeypatch) -> None:
    """Make any decoding by the folder DataModule fail, so that a result can only come from the cache."""

    def decode(path, channels=None):
        raise AssertionError(f"decoded {path}")

    monkeypatch.setattr(folder_module, "decode_image_file", decode)


def test_the_survey_is_cached_outside_the_data_folder_and_redone_when_a_file_changes(reading, tmp_path, monkeypatch):
    root = shutil.copytree(reading[0], tmp_path / "data")
    cache = tmp_path / "cache"
    before = snapshot(root)
    first = ImageFolderDataModule(str(root), cache_dir=str(cache)).spec
    (written,) = cache.iterdir()
    assert re.fullmatch(r"folder-survey-[0-9a-f]{32}\.json", written.name)
    saved = json.loads(written.read_text())
    assert saved["root"] == str(root.resolve()) and saved["input_shape"] == [3, *SIZE]
    assert saved["mean"] == list(first.mean) and saved["std"] == list(first.std)
    assert snapshot(root) == before, "nothing written into the data folder"

    # A second DataModule (another process, a later run) reads the cache: it decodes nothing.
    with monkeypatch.context() as patch:
        refuse_to_decode(patch)
        assert ImageFolderDataModule(str(root), cache_dir=str(cache)).spec == first
        # Other conversion settings are another survey.
        with pytest.raises(AssertionError, match="decoded"):
            _ = ImageFolderDataModule(str(root), cache_dir=str(cache), channels=1).spec

    # A file rewritten (other pixels, same size, a new modification time) is decoded again.
    changed = root / "train/mango/img3.png"
    new_pixels = write_image(changed, np.full((*SIZE, 3), 7, dtype=np.uint8))
    os.utime(changed, ns=(changed.stat().st_atime_ns, changed.stat().st_mtime_ns + 10**9))
    with monkeypatch.context() as patch:
        refuse_to_decode(patch)
        with pytest.raises(AssertionError, match="decoded"):
            _ = ImageFolderDataModule(str(root), cache_dir=str(cache)).spec
    again = ImageFolderDataModule(str(root), cache_dir=str(cache)).spec
    images = {path: np.asarray(Image.open(root / path)) for path in TRAIN_ORDER}
    assert np.array_equal(images["train/mango/img3.png"], new_pixels)
    train = np.stack(list(images.values())).astype(np.float64) / 255
    assert again.mean == pytest.approx(train.mean(axis=(0, 1, 2)).tolist(), abs=1e-12) and again.mean != first.mean
    assert len(list(cache.iterdir())) == 2, "one survey per state of the files"
    # Another size: decoded again, and refused (the cache held the other size).
    write_image(changed, np.zeros((SIZE[0] + 1, SIZE[1], 3), dtype=np.uint8))
    with pytest.raises(DataFormatError, match=f"^{re.escape(str(changed))} is 13x10 pixels, "):
        _ = ImageFolderDataModule(str(root), cache_dir=str(cache)).spec


def test_a_read_only_data_folder_is_read_and_nothing_is_written_into_it(reading, tmp_path):
    root = shutil.copytree(reading[0], tmp_path / "data")
    cache = tmp_path / "cache"
    for parent, _, files in os.walk(root):
        for name in files:
            os.chmod(Path(parent) / name, 0o444)
    for parent, _, _ in sorted(os.walk(root), reverse=True):
        os.chmod(parent, 0o555)
    before = snapshot(root)
    try:
        dm = ImageFolderDataModule(str(root), global_batch_size=4, cache_dir=str(cache), in_memory_limit_mib=0)
        dm.prepare_data()
        dm.trainer = SimpleNamespace(world_size=1, global_rank=0, accumulate_grad_batches=1)
        dm.setup("fit")
        images, labels = next(iter(dm.train_dataloader()))
        assert images.shape == (4, 3, *SIZE) and labels.shape == (4,)
        assert len(list(cache.iterdir())) == 1
        # Run as root, the permissions do not stop a write: the snapshot is what shows there was none.
        assert snapshot(root) == before
    finally:
        restore_permissions(root)


def test_without_cache_dir_nothing_is_cached(reading, tmp_path, monkeypatch):
    root = shutil.copytree(reading[0], tmp_path / "data")
    before = snapshot(tmp_path)

    def write_json(path, data):
        raise AssertionError(f"wrote {path}")

    monkeypatch.setattr(folder_module, "write_json", write_json)
    first = ImageFolderDataModule(str(root), cache_dir=None).spec
    assert first.input_shape == (3, *SIZE)
    assert snapshot(tmp_path) == before
    refuse_to_decode(monkeypatch)
    with pytest.raises(AssertionError, match="decoded"):
        _ = ImageFolderDataModule(str(root), cache_dir=None).spec


# In memory vs from disk.


@pytest.fixture(scope="module")
def learnable(tmp_path_factory) -> Path:
    """The test task's coloured patches (:func:`vision_task.classifier.make_image_folder`), 16x16:
    40 training images (36 after the held-out 4) and 10 test images."""
    return make_image_folder(tmp_path_factory.mktemp("learnable"), counts={"train": 8, "test": 2}, size=(16, 16))


def batches(loader, epoch: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    if hasattr(loader.sampler, "set_epoch"):
        loader.sampler.set_epoch(epoch)  # what Lightning's fit loop does at each epoch start
    return [(images.clone(), labels.clone()) for images, labels in loader]


def assert_same_batches(ours, theirs) -> None:
    assert len(ours) == len(theirs) > 0
    for (images, labels), (their_images, their_labels) in zip(ours, theirs):
        assert images.dtype == their_images.dtype == torch.uint8
        assert torch.equal(images, their_images) and torch.equal(labels, their_labels)
        assert labels.dtype == their_labels.dtype == torch.int64


def test_in_memory_and_from_disk_serve_the_same_batches(learnable, tmp_path):
    cache = str(tmp_path / "cache")
    for rank in (0, 1):
        memory = on_rank(learnable, 2, rank, global_batch_size=6, cache_dir=cache)
        disk = on_rank(learnable, 2, rank, global_batch_size=6, cache_dir=cache, in_memory_limit_mib=0)
        workers = on_rank(
            learnable, 2, rank, global_batch_size=6, cache_dir=cache, in_memory_limit_mib=0, num_workers=2
        )
        assert memory.in_memory and not disk.in_memory
        assert all(isinstance(getattr(memory, split), GatherDataset) for split in ("train_set", "val_set", "test_set"))
        assert all(isinstance(getattr(disk, split), FolderImages) for split in ("train_set", "val_set", "test_set"))
        for epoch in (0, 1):
            expected = batches(memory.train_dataloader(), epoch)
            assert len(expected) == 6, "36 training images, 3 per batch on each of 2 ranks"
            assert_same_batches(batches(disk.train_dataloader(), epoch), expected)
        loader = workers.train_dataloader()
        assert loader.num_workers == 2
        assert_same_batches(batches(loader, 1), batches(memory.train_dataloader(), 1))
        assert_same_batches(batches(workers.val_dataloader(), 0), batches(memory.val_dataloader(), 0))
        assert_same_batches(batches(disk.test_dataloader(), 0), batches(memory.test_dataloader(), 0))
    first, second = (batches(memory.train_dataloader(), epoch)[0][0] for epoch in (0, 1))
    assert not torch.equal(first, second), "another order in another epoch"


def train_in_process(root: Path, root_dir: Path, *overrides: str) -> tuple[dict[str, torch.Tensor], type, int]:
    """The test task's default network (the MLP) trained 8 steps by Lightning in this process on
    ``root`` (dropout 0): its final parameters, the type of the training split and the training
    loader's worker count."""
    with initialize_config_dir(config_dir=str(TASK.configs()), version_base="1.3"):
        cfg = compose(config_name="config", overrides=[
            "data=folder", f"data.root={root}", "data.global_batch_size=4", "model.net.dropout=0",
            f"data.cache_dir={root_dir / 'cache'}", *overrides,
        ])  # fmt: skip
    datamodule = instantiate(cfg.data)
    L.seed_everything(0)
    model = build_model(cfg.model, datamodule.spec)
    initial = {name: tensor.clone() for name, tensor in model.net.state_dict().items()}
    trainer = L.Trainer(
        accelerator="cpu", devices=1, max_steps=8, logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, use_distributed_sampler=False, num_sanity_val_steps=0, limit_val_batches=0,
        default_root_dir=root_dir,
    )  # fmt: skip
    trainer.fit(model, datamodule=datamodule)
    assert trainer.global_step == 8
    final = model.net.state_dict()
    assert not torch.equal(final["layers.1.weight"], initial["layers.1.weight"]), "it trained"
    return final, type(datamodule.train_set), trainer.train_dataloader.num_workers


def test_in_memory_and_from_disk_with_workers_train_the_same_parameters(learnable, tmp_path):
    memory, memory_split, memory_workers = train_in_process(learnable, tmp_path)
    disk, disk_split, disk_workers = train_in_process(
        learnable, tmp_path, "data.in_memory_limit_mib=0", "data.num_workers=2"
    )
    assert (memory_split, memory_workers, disk_split, disk_workers) == (GatherDataset, 0, FolderImages, 2)
    assert memory.keys() == disk.keys()
    for name in memory:
        assert torch.equal(memory[name], disk[name]), name


# Bad inputs: each refused in one line naming the file or folder and the fix.


def tiny(root: Path, layout: dict[str, dict[str, int]] | None = None, size=(8, 8), seed: int = 0) -> Path:
    """PNGs ``root/<split>/<class>/<i>.png`` of random RGB pixels: ``layout`` ``{split: {class: count}}``
    (default: classes a and b, 2 training and 1 test image each)."""
    rng = np.random.default_rng(seed)
    for split, classes in (layout or {"train": {"a": 2, "b": 2}, "test": {"a": 1, "b": 1}}).items():
        for name, count in classes.items():
            (root / split / name).mkdir(parents=True, exist_ok=True)
            for i in range(count):
                write_image(root / split / name / f"{i}.png", pixels_hwc(rng, size))
    return root


def truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


LAYOUT_FIX = "a folder data set holds train/<class>/*.png, test/<class>/*.png and optionally val/<class>/*.png"
DECODE_FIX = "Replace it with a PNG or JPEG image, or remove it."


def undecodable(path: Path) -> re.Pattern:
    """The refusal of a file Pillow cannot decode: its path, Pillow's reason in parentheses (its own
    words, which depend on its version and on where a file ends, not asserted; without the path
    again) and the fix."""
    reason = rf"\(((?!{re.escape(str(path))}).)+\)"
    return re.compile(rf"{re.escape(str(path))} cannot be decoded as an image {reason}\. {re.escape(DECODE_FIX)}")


def no_root(root):
    message = (
        f"data.root={root / 'nowhere'} is not a folder. Point it at a folder with train/<class>/ and test/<class>/ "
        "folders of PNG or JPEG images (for eval, predict or export of a run whose folder moved: "
        "data.root=<its new place>)."
    )
    return {"root": root / "nowhere"}, DataNotAvailableError, message


def root_is_a_file(root):
    (root / "data.zip").write_bytes(b"PK")
    return {"root": root / "data.zip"}, DataNotAvailableError, f"data.root={root / 'data.zip'} is not a folder. Point"


def no_train(root):
    tiny(root, {"test": {"a": 1}})
    return {}, DataFormatError, f"data.root={root} has no train/ folder: {LAYOUT_FIX} (engine/docs/vision.md)."


def no_test(root):
    tiny(root, {"train": {"a": 2}, "val": {"a": 1}})
    return {}, DataFormatError, f"data.root={root} has no test/ folder: {LAYOUT_FIX} (engine/docs/vision.md)."


def no_class_folder(root):
    tiny(root, {"test": {"a": 1}})
    write_image(root / "train/0.png", pixels_hwc(np.random.default_rng(0), (8, 8)))
    message = (
        f"{root / 'train'} holds no class folder: put each class's images in a folder of its own, "
        f"{root / 'train'}/<class name>/*.png (or .jpg)."
    )
    return {}, DataFormatError, message


def empty_class(root):
    tiny(root, {"train": {"a": 2}, "test": {"a": 1}})
    (root / "train/b/more").mkdir(parents=True)
    (root / "train/b/notes.txt").write_text("images to come\n")
    message = f"{root / 'train/b'} holds no PNG or JPEG image: add the class's images, or remove the folder."
    return {}, DataFormatError, message


def empty_test_class(root):
    tiny(root)
    (root / "test/b/0.png").unlink()
    return {}, DataFormatError, f"{root / 'test/b'} holds no PNG or JPEG image: add the class's images, or remove"


def class_not_in_train(root):
    tiny(root, {"train": {"a": 2, "b": 2}, "test": {"a": 1, "c": 1}})
    message = (
        f"{root / 'test/c'} is not a class of {root / 'train'} (its classes: a, b). "
        "Rename it to one of them, or add the class to train/ too."
    )
    return {}, DataFormatError, message


def val_class_not_in_train(root):
    tiny(root, {"train": {"a": 2, "b": 2}, "val": {"a": 1, "bb": 1}, "test": {"a": 1}})
    return {}, DataFormatError, f"{root / 'val/bb'} is not a class of {root / 'train'} (its classes: a, b). Rename"


def mixed_sizes(root):
    tiny(root)
    write_image(root / "train/b/0.png", pixels_hwc(np.random.default_rng(1), (6, 10)))
    message = (
        f"{root / 'train/b/0.png'} is 6x10 pixels, {root / 'train/a/0.png'} is 8x8: a data set needs one image "
        "size. Resize them all with data.image_size=[8,8] (height, width)."
    )
    return {}, DataFormatError, message


def mixed_channels(root):
    tiny(root)
    write_image(root / "train/b/1.png", pixels_hwc(np.random.default_rng(1), (8, 8), channels=1))
    message = (
        f"{root / 'train/b/1.png'} has 1 channel, {root / 'train/a/0.png'} has 3: a data set needs one channel "
        "count. Convert them all with data.channels=3 (or 1)."
    )
    return {}, DataFormatError, message


def not_an_image(root):
    tiny(root)
    (root / "train/b/1.png").write_text("<html>404 not found</html>\n")
    return {}, DataFormatError, undecodable(root / "train/b/1.png")


def truncated_png(root):
    tiny(root)
    truncate(root / "test/b/0.png")
    return {}, DataFormatError, undecodable(root / "test/b/0.png")


def truncated_jpeg(root):
    tiny(root)
    write_image(root / "train/a/2.jpg", pixels_hwc(np.random.default_rng(1), (8, 8)), quality=90)
    truncate(root / "train/a/2.jpg")
    return {}, DataFormatError, undecodable(root / "train/a/2.jpg")


def unreadable_file(root):
    tiny(root)
    (root / "train/b/1.png").chmod(0o000)
    message = (
        f"{root / 'train/b/1.png'} cannot be read (Permission denied). "
        "Make it readable for this user (chmod a+r), or remove it."
    )
    return {}, DataNotAvailableError, message


def unreadable_folder(root):
    tiny(root, {"train": {"a": 2, "b": 1}, "test": {"a": 1}})
    write_image(root / "train/b/more/0.png", pixels_hwc(np.random.default_rng(1), (8, 8)))
    (root / "train/b/more").chmod(0o000)
    return {}, DataNotAvailableError, f"{root / 'train/b/more'} cannot be read: permission denied (chmod a+rx)."


def no_training_image_left(root):
    tiny(root)
    message = (
        f"data.val_size=4 holds out 4 of the 4 images of {root / 'train'}, leaving none for training: give a "
        "fraction in (0, 1) or a count between 1 and 3, or add a val/ folder."
    )
    return {"val_size": 4}, ConfigValueError, message


def no_validation_image_left(root):
    tiny(root)
    message = (
        f"data.val_size=0.1 holds out 0 of the 4 images of {root / 'train'}, leaving none for validation: give a "
        "fraction in (0, 1) or a count between 1 and 3, or add a val/ folder."
    )
    return {"val_size": 0.1}, ConfigValueError, message


def constant_channel(root):
    for split, name in (("train", "a"), ("train", "b"), ("test", "a")):
        write_image(root / split / name / "0.png", np.zeros((8, 8, 3), dtype=np.uint8))
    message = (
        f"The training images of {root / 'train'} have a channel of one constant value (std [0.0, 0.0, 0.0]), "
        "which cannot be normalized: give data.std (and data.mean) yourself."
    )
    return {}, DataFormatError, message


AS_ROOT = os.geteuid() == 0
AS_ROOT_SKIP = pytest.mark.skipif(AS_ROOT, reason="root reads any file and folder")
CASES = [
    no_root, root_is_a_file, no_train, no_test, no_class_folder, empty_class, empty_test_class, class_not_in_train,
    val_class_not_in_train, mixed_sizes, mixed_channels, not_an_image, truncated_png, truncated_jpeg,
    no_training_image_left, no_validation_image_left, constant_channel,
    pytest.param(unreadable_file, marks=AS_ROOT_SKIP), pytest.param(unreadable_folder, marks=AS_ROOT_SKIP),
]  # fmt: skip


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.__name__)
def test_bad_input_is_refused_in_one_line_naming_the_file_and_the_fix(case, tmp_path):
    try:
        kwargs, error, expected = case(tmp_path)
        dm = ImageFolderDataModule(
            **{"root": str(tmp_path), "cache_dir": str(tmp_path / "cache"), "val_size": 1, **kwargs}
        )
        with pytest.raises(error) as raised:
            dm.prepare_data()
            dm.check_splits()  # what the training command runs next
    finally:
        restore_permissions(tmp_path)
    message = str(raised.value)
    assert "\n" not in message, "one line"
    if isinstance(expected, re.Pattern):
        assert expected.fullmatch(message), message
    elif expected.endswith("."):
        assert message == expected
    else:
        assert message.startswith(expected), message
    # Their surveys are right (and kept): the statistics, or the split, are refused after them.
    if case not in (constant_channel, no_training_image_left, no_validation_image_left):
        assert not (tmp_path / "cache").exists(), "a refused data set leaves no survey behind"


def test_an_unreadable_subfolder_is_refused_not_skipped(tmp_path, monkeypatch):
    # As root nothing is unreadable: os.scandir of the subfolder fails as it fails for another user
    # (Path.rglob, used before, skipped such a folder and its images without a word).
    kwargs, error, expected = unreadable_folder(tmp_path)
    scandir = os.scandir

    def denied(path="."):
        if Path(path) == tmp_path / "train/b/more":
            raise PermissionError(13, "Permission denied", os.fspath(path))
        return scandir(path)

    monkeypatch.setattr(os, "scandir", denied)
    with pytest.raises(error) as raised:
        ImageFolderDataModule(str(tmp_path)).prepare_data()
    assert str(raised.value) == expected
    restore_permissions(tmp_path)


def test_refused_inputs_are_accepted_with_the_setting_that_converts_them(tmp_path):
    mixed_sizes(tmp_path / "sizes")
    dm = on_rank(tmp_path / "sizes", image_size=[8, 8], val_size=1)
    assert dm.spec.input_shape == (3, 8, 8) and dm.train_set.tensors[0].shape == (3, 3, 8, 8)
    mixed_channels(tmp_path / "channels")
    dm = on_rank(tmp_path / "channels", channels=3, val_size=1)
    assert dm.spec.input_shape == (3, 8, 8)
    # The gray image as RGB: its gray level in each channel.
    gray = torch.from_numpy(np.array(Image.open(tmp_path / "channels/train/b/1.png")))
    assert (
        sum(
            torch.equal(image, gray.expand(3, 8, 8))
            for image in torch.cat([dm.train_set.tensors[0], dm.val_set.tensors[0]])
        )
        == 1
    )
    constant_channel(tmp_path / "constant")
    assert on_rank(tmp_path / "constant", mean=0.0, std=1.0, val_size=1).spec.std == (1.0, 1.0, 1.0)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            {"mean": 0.5},
            "data.mean=0.5 is given without data.std: give both (per channel, on a 0..1 scale), or leave "
            "both null to compute them from train/.",
        ),
        (
            {"std": [0.2, 0.2, 0.2]},
            "data.std=[0.2, 0.2, 0.2] is given without data.mean: give both (per channel, on "
            "a 0..1 scale), or leave both null to compute them from train/.",
        ),
        ({"val_size": 0}, "data.val_size=0 must be a fraction in (0, 1) or a count of at least 1."),
        ({"image_size": [8]}, "data.image_size=[8] must be [height, width] in pixels, or null."),
        ({"channels": 5}, "data.channels=5 must be 1 (gray), 3 (RGB), 2 or 4 (with alpha), or null."),
    ],
)
def test_bad_settings_are_refused_by_the_constructor(tmp_path, kwargs, message):
    with pytest.raises(ConfigValueError) as raised:
        ImageFolderDataModule(str(tmp_path), **kwargs)
    assert str(raised.value) == message


def test_the_training_commands_checks_accept_a_good_folder_and_refuse_a_val_size_that_leaves_no_training(
    learnable, tmp_path
):
    # In process, what the command runs before it starts any process (ddp_engine.config.checks.check_data).
    good = ["data=folder", f"data.root={learnable}", "data.global_batch_size=4", "trainer.accelerator=cpu",
            "trainer.devices=2", f"paths.log_dir={tmp_path}"]  # fmt: skip
    check_command_line("config", good)
    assert len(list((tmp_path / ".cache").iterdir())) == 1, "the survey, for the processes to read"
    with pytest.raises(ConfigValueError) as raised:
        check_command_line("config", [*good, "data.val_size=40"])
    assert str(raised.value) == (
        f"data.val_size=40 holds out 40 of the 40 images of {learnable / 'train'}, leaving none for training: give a "
        "fraction in (0, 1) or a count between 1 and 39, or add a val/ folder."
    )


# The one test here that starts the real command line (the rest run in this process).
@pytest.mark.processes
def test_the_command_line_refuses_a_bad_folder_in_one_line_before_any_process_starts(tmp_path):
    data, log_dir = tmp_path / "data", tmp_path / "logs"
    truncated_png(data)
    result = run_cli("vision_task.train", "data=folder", f"data.root={data}", "trainer.accelerator=cpu",
                     "trainer.devices=2", log_dir=log_dir, timeout=300)  # fmt: skip
    assert result.returncode == 1, result.stderr[-3000:]
    (line,) = result.stderr.splitlines()
    assert line.startswith("Error: ") and undecodable(data / "test/b/0.png").fullmatch(line.removeprefix("Error: ")), (
        line
    )
    assert not (log_dir / "runs").exists() or not any((log_dir / "runs").iterdir()), "no run directory"
    assert not (log_dir / ".cache").exists() or not any((log_dir / ".cache").iterdir()), "no survey kept"
    # No process of the command is left (the refusal comes before any worker starts).
    left = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if str(log_dir) in command or str(data) in command:
            left.append((pid, command))
    assert left == []
