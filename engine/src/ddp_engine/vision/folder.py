"""A folder of images by class as a DataModule: ``data=folder data.root=<dir>``.

The layout is torchvision's ``ImageFolder``'s, one folder per split::

    <root>/train/<class>/*.png|*.jpg    required; the class names are these folders' names, sorted
    <root>/val/<class>/...              optional; without it, a seeded part of train/ (data.val_size)
    <root>/test/<class>/...             required; every class must be one of train/'s

Before any process starts (``prepare_data``, which the training command calls first), every image
is decoded once, so that a file that cannot be read is refused naming it, and the data set is
surveyed: one channel count (or ``channels`` to convert), one image size (or ``image_size`` to
resize), and, unless given, the per-channel mean and std of the training images. The survey is
kept in ``cache_dir`` (never in the data folder, which may be read-only) under a fingerprint of
the files' names, sizes and modification times, so that later runs on the same files, and their
other processes, read it instead of decoding everything again.

Training decodes each image once more: all of them into memory as uint8 when they fit under
``in_memory_limit_mib`` (then every batch is one gather, as for the IDX files), otherwise one
sample at a time from disk in ``num_workers`` DataLoader workers. Both go through the same
sharding, exact evaluation and resume of :class:`~ddp_engine.vision.classification.ClassificationDataModule`.
"""

import hashlib
import json
import logging
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor
from torch.utils.data import Dataset
from typing_extensions import override

from ddp_engine.api import ConfigValueError, DataFormatError, DataNotAvailableError, GatherDataset, write_json
from ddp_engine.vision.classification import ClassificationDataModule
from ddp_engine.vision.images import decode_image_file, is_image_file, resized
from ddp_engine.vision.spec import DataSpec, per_channel

log = logging.getLogger(__name__)

#: The split folders under the root; ``val`` is optional.
SPLITS = ("train", "val", "test")
#: Bumped when the survey's content changes, so that older cache files are not read.
SURVEY_VERSION = 1


@dataclass
class FolderSplit:
    """One split folder's images: their files and labels (indices into the class names), in a
    stable order (class by class, files sorted by their path)."""

    files: list[Path]
    labels: list[int]


def list_classes(folder: Path) -> list[str]:
    """The class folders of a split folder, sorted by name (``ImageFolder``'s order).

    Raises:
        DataNotAvailableError: when ``folder`` cannot be read.
        DataFormatError: when it holds no class folder.
    """
    try:
        classes = sorted(entry.name for entry in os.scandir(folder) if entry.is_dir() and entry.name[0] != ".")
    except PermissionError:
        raise DataNotAvailableError(f"{folder} cannot be read: permission denied (chmod a+rx).") from None
    if not classes:
        raise DataFormatError(
            f"{folder} holds no class folder: put each class's images in a folder of its own, "
            f"{folder}/<class name>/*.png (or .jpg)."
        )
    return classes


def _refuse_unreadable(error: OSError) -> None:
    """``os.walk``'s ``onerror``: a folder that cannot be listed is refused, naming it."""
    if isinstance(error, PermissionError):
        raise DataNotAvailableError(f"{error.filename} cannot be read: permission denied (chmod a+rx).") from None
    raise error


def _image_files(folder: Path) -> list[Path]:
    """The PNG and JPEG files in ``folder`` and its subfolders; hidden ones (``.name``, such as the
    ``._photo.png`` that macOS writes beside copies) left out, as hidden folders are.

    Raises:
        DataNotAvailableError: for a folder that cannot be read (``os.walk``, not ``Path.rglob``:
            rglob skips such a folder, and its images, without a word).
    """
    found = []
    for parent, folders, names in os.walk(folder, onerror=_refuse_unreadable):
        folders[:] = [name for name in folders if not name.startswith(".")]
        found += [Path(parent) / name for name in names if not name.startswith(".") and is_image_file(Path(name))]
    return [path for path in found if path.is_file()]


def scan_split(folder: Path, class_names: Sequence[str]) -> FolderSplit:
    """The images of the split folder ``folder`` (each class folder and its subfolders, recursively;
    files other than PNG and JPEG, and hidden ones, left out), labelled by ``class_names``.

    Raises:
        DataNotAvailableError: when a folder cannot be read.
        DataFormatError: for a class folder that is not one of ``class_names`` (named, with them),
            or one that holds no image.
    """
    files, labels = [], []
    for name in list_classes(folder):
        if name not in class_names:
            raise DataFormatError(
                f"{folder / name} is not a class of {folder.parent / 'train'} (its classes: {', '.join(class_names)}). "
                "Rename it to one of them, or add the class to train/ too."
            )
        images = sorted(_image_files(folder / name))
        if not images:
            raise DataFormatError(
                f"{folder / name} holds no PNG or JPEG image: add the class's images, or remove the folder."
            )
        files += images
        labels += [class_names.index(name)] * len(images)
    return FolderSplit(files, labels)


@dataclass
class Survey:
    """What decoding every image of a folder data set found (kept in the cache as JSON)."""

    #: ``(C, H, W)`` of the images as served (after ``channels`` and ``image_size``).
    input_shape: tuple[int, int, int]
    #: Per channel, mean and population standard deviation of the training images' pixels on a 0..1 scale.
    mean: tuple[float, ...]
    std: tuple[float, ...]


class FolderImages(Dataset):
    """The images of a split decoded from disk one at a time: sample ``i`` is ``(pixels (C, H, W)
    uint8, label)``, converted to ``channels`` and resized to ``image_size`` (``(H, W)``) as the
    survey found or was asked. For data sets too large for memory, in DataLoader workers."""

    def __init__(self, split: FolderSplit, channels: int, image_size: tuple[int, int]) -> None:
        self.split, self.channels, self.image_size = split, channels, tuple(image_size)

    def __len__(self) -> int:
        return len(self.split.files)

    def __getitem__(self, index: int) -> tuple[Tensor, int]:
        pixels = resized(decode_image_file(self.split.files[index], self.channels), self.image_size)
        return pixels, self.split.labels[index]


class ImageFolderDataModule(ClassificationDataModule):
    """A folder of images by class (see the module's docstring), sharded explicitly across the DDP
    process group.

    Args:
        root: the folder that holds ``train/``, ``test/`` and optionally ``val/``.
        global_batch_size, num_workers, shuffle_seed, crop_padding, horizontal_flip,
            prepare_data_per_node, on_device: see :class:`~ddp_engine.vision.classification.ClassificationDataModule`.
        val_size: without ``val/``, the training images held out for validation: a fraction in
            ``(0, 1)`` (default 0.1) or a count of at least 1 (as scikit-learn's ``test_size``).
            Ignored when ``val/`` exists.
        split_seed: seed of that split (default 0).
        image_size: ``(H, W)`` to resize every image to (bilinear, antialiased), or None
            (default): the images' own, which must be one size.
        channels: channels to convert every image to (1 gray, 3 RGB; 2 and 4 with alpha), or
            None (default): the images' own, which must be one count.
        mean: per-channel mean of the training pixels on a 0..1 scale (one value for all
            channels, or one per channel), or None (default): computed from ``train/``'s images.
        std: their standard deviation, likewise.
        in_memory_limit_mib: the most MiB of decoded uint8 pixels (all splits) held in memory per
            process (default 2048); a larger data set is decoded from disk per sample.
        cache_dir: where the survey is kept (default None: not kept, every run decodes every
            image once more before it starts); the configs give ``${paths.log_dir}/.cache``.

    Raises:
        ConfigValueError: from the constructor for a ``val_size`` of 0 or less, an
            ``image_size`` that is not two positive sizes, a ``channels`` other than 1..4,
            ``mean`` without ``std`` (or the reverse); from :meth:`prepare_data` and
            :meth:`describe` for a ``val_size`` that leaves no image on one side.
        DataNotAvailableError: for a missing or unreadable folder or file, naming it.
        DataFormatError: for a folder layout or images that do not fit (see the module's
            docstring): no class folder, an empty class, a class of ``test/`` or ``val/`` that
            ``train/`` lacks, an image that cannot be decoded, mixed channel counts or image
            sizes without ``channels`` / ``image_size``; each names the file or folder and the fix.
    """

    #: Where the folder and its survey are, and how much is held in memory, may change between a run
    #: and its resume or evaluation.
    loading_keys = (*ClassificationDataModule.loading_keys, "root", "cache_dir", "in_memory_limit_mib")
    #: Beyond the in-memory splits, the images decoded per sample by the workers (in_memory_limit_mib).
    worker_modules = (*ClassificationDataModule.worker_modules, FolderImages.__module__)

    def __init__(
        self,
        root: str,
        global_batch_size: int = 128,
        val_size: float = 0.1,
        split_seed: int = 0,
        shuffle_seed: int = 0,
        num_workers: int = 0,
        prepare_data_per_node: bool = True,
        on_device: bool = False,
        crop_padding: int = 0,
        horizontal_flip: bool = False,
        image_size: Sequence[int] | None = None,
        channels: int | None = None,
        mean: float | Sequence[float] | None = None,
        std: float | Sequence[float] | None = None,
        in_memory_limit_mib: int = 2048,
        cache_dir: str | None = None,
    ) -> None:
        super().__init__(
            global_batch_size, num_workers=num_workers, shuffle_seed=shuffle_seed, crop_padding=crop_padding,
            horizontal_flip=horizontal_flip, prepare_data_per_node=prepare_data_per_node, on_device=on_device,
        )  # fmt: skip
        if not val_size > 0:
            raise ConfigValueError(f"data.val_size={val_size} must be a fraction in (0, 1) or a count of at least 1.")
        if image_size is not None and (len(image_size) != 2 or min(image_size) < 1):
            raise ConfigValueError(f"data.image_size={list(image_size)} must be [height, width] in pixels, or null.")
        if channels is not None and channels not in (1, 2, 3, 4):
            raise ConfigValueError(f"data.channels={channels} must be 1 (gray), 3 (RGB), 2 or 4 (with alpha), or null.")
        if (mean is None) != (std is None):
            given, missing = ("data.mean", "data.std") if std is None else ("data.std", "data.mean")
            raise ConfigValueError(
                f"{given}={mean if std is None else std} is given without {missing}: give both (per channel, on a "
                "0..1 scale), or leave both null to compute them from train/."
            )
        self.root = Path(root)
        # A count, as typed: the config's schema types val_size as a float, which makes 40 into 40.0.
        val_size = int(val_size) if val_size >= 1 and float(val_size).is_integer() else val_size
        self.val_size, self.split_seed = val_size, split_seed
        self.image_size = tuple(image_size) if image_size is not None else None
        self.channels = channels
        # As given (one value or one per channel); describe() spreads them over the channels.
        self.given_mean, self.given_std = mean, std
        self.in_memory_limit_mib = in_memory_limit_mib
        self.cache_dir = Path(cache_dir) if cache_dir is not None else None
        self._splits: dict[str, FolderSplit] | None = None

    # The folder layout.

    @property
    def splits(self) -> dict[str, FolderSplit]:
        """Each split folder's images (``val`` only when the folder exists), scanned once.

        Raises:
            DataNotAvailableError, DataFormatError: see :func:`list_classes` and :func:`scan_split`.
        """
        if self._splits is None:
            if not self.root.is_dir():
                raise DataNotAvailableError(
                    f"data.root={self.root} is not a folder. Point it at a folder with train/<class>/ and "
                    "test/<class>/ folders of PNG or JPEG images (for eval, predict or export of a run whose "
                    "folder moved: data.root=<its new place>)."
                )
            for required in ("train", "test"):
                if not (self.root / required).is_dir():
                    raise DataFormatError(
                        f"data.root={self.root} has no {required}/ folder: a folder data set holds "
                        "train/<class>/*.png, test/<class>/*.png and optionally val/<class>/*.png "
                        "(engine/docs/vision.md)."
                    )
            class_names = list_classes(self.root / "train")
            self._splits = {
                split: scan_split(self.root / split, class_names)
                for split in SPLITS
                if split != "val" or (self.root / "val").is_dir()
            }
            self._class_names = class_names
        return self._splits

    def _val_count(self) -> int:
        """Images of ``train/`` held out for validation when there is no ``val/`` folder."""
        total = len(self.splits["train"].files)
        count = round(total * self.val_size) if self.val_size < 1 else int(self.val_size)
        if not 0 < count < total:
            raise ConfigValueError(
                f"data.val_size={self.val_size} holds out {count} of the {total} images of {self.root / 'train'}, "
                f"leaving none for {'validation' if count <= 0 else 'training'}: give a fraction in (0, 1) or a count "
                f"between 1 and {total - 1}, or add a val/ folder."
            )
        return count

    def _train_and_val(self) -> tuple[FolderSplit, FolderSplit]:
        """The training and validation splits: ``train/`` and ``val/``, or a seeded split of ``train/``."""
        train = self.splits["train"]
        if "val" in self.splits:
            return train, self.splits["val"]
        count = self._val_count()
        # Same generator seed on every rank and every stage -> the same split everywhere.
        order = torch.randperm(len(train.files), generator=torch.Generator().manual_seed(self.split_seed)).tolist()
        pick = lambda indices: FolderSplit([train.files[i] for i in indices], [train.labels[i] for i in indices])  # noqa: E731
        return pick(order[count:]), pick(order[:count])

    # The survey: every image decoded once, its result cached.

    def _fingerprint(self) -> str:
        """A hash of what the survey depends on: the files' paths, sizes and modification times, and
        the conversion settings."""
        digest = hashlib.sha256(json.dumps([SURVEY_VERSION, self.image_size, self.channels]).encode())
        for split, content in self.splits.items():
            for path, label in zip(content.files, content.labels):
                stat = path.stat()
                digest.update(
                    f"{split}\0{path.relative_to(self.root)}\0{label}\0{stat.st_size}\0{stat.st_mtime_ns}\n".encode()
                )
        return digest.hexdigest()

    def _cache_file(self, fingerprint: str) -> Path | None:
        return self.cache_dir / f"folder-survey-{fingerprint[:32]}.json" if self.cache_dir is not None else None

    def survey(self) -> Survey:
        """Decode every image once (unless the cache holds this data set's survey): check that each
        can be decoded and that they share one channel count and size (after ``channels`` and
        ``image_size``), and compute the training images' per-channel mean and std.

        Raises:
            DataNotAvailableError, DataFormatError: see the class's docstring.
        """
        fingerprint = self._fingerprint()
        cache = self._cache_file(fingerprint)
        if cache is not None and cache.is_file():
            saved = json.loads(cache.read_text())
            return Survey(tuple(saved["input_shape"]), tuple(saved["mean"]), tuple(saved["std"]))
        count = sum(len(split.files) for split in self.splits.values())
        log.info(f"Checking the {count} images of {self.root} (once: the result is kept in {self.cache_dir})")
        first: dict[str, object] = {}  # the first image's path and shape, which every other must have
        sums = sums_of_squares = None
        pixels_per_channel = 0
        for split, content in self.splits.items():
            for path in content.files:
                pixels = decode_image_file(path, self.channels)
                self._check_like_first(path, pixels, first)
                if self.image_size is not None:
                    pixels = resized(pixels, self.image_size)
                if split == "train":
                    values = pixels.reshape(pixels.shape[0], -1).double() / 255.0
                    sums = values.sum(1) if sums is None else sums + values.sum(1)
                    squares = (values * values).sum(1)
                    sums_of_squares = squares if sums_of_squares is None else sums_of_squares + squares
                    pixels_per_channel += values.shape[1]
        channels, *size = first["shape"]
        height, width = self.image_size or size
        mean = sums / pixels_per_channel
        std = (sums_of_squares / pixels_per_channel - mean * mean).clamp(min=0).sqrt()
        survey = Survey((channels, height, width), tuple(mean.tolist()), tuple(std.tolist()))
        if cache is not None:
            write_json(cache, {"root": str(self.root.resolve()), "fingerprint": fingerprint,
                               "input_shape": list(survey.input_shape), "mean": list(survey.mean),
                               "std": list(survey.std)})  # fmt: skip
        return survey

    def _check_like_first(self, path: Path, pixels: Tensor, first: dict) -> None:
        """Refuse an image whose channel count, or size (unless ``image_size`` resizes them all),
        differs from the first image's; remember the first one in ``first``."""
        if not first:
            first.update(path=path, shape=tuple(pixels.shape))
            return
        (channels, *size), (seen_channels, *seen_size), other = pixels.shape, first["shape"], first["path"]
        if channels != seen_channels:
            raise DataFormatError(
                f"{path} has {channels} channel{'s' * (channels > 1)}, {other} has {seen_channels}: a data set needs "
                "one channel count. Convert them all with data.channels=3 (or 1)."
            )
        if self.image_size is None and list(size) != seen_size:
            raise DataFormatError(
                f"{path} is {size[0]}x{size[1]} pixels, {other} is {seen_size[0]}x{seen_size[1]}: a data set needs one "
                f"image size. Resize them all with data.image_size=[{seen_size[0]},{seen_size[1]}] (height, width)."
            )

    # The DataModule's hooks.

    @override
    def describe(self) -> DataSpec:
        """The class names (``train/``'s folders), the surveyed image shape, and the given or
        computed mean and std."""
        survey = self.survey()
        channels = survey.input_shape[0]
        mean = per_channel(self.given_mean, channels) if self.given_mean is not None else survey.mean
        std = per_channel(self.given_std, channels) if self.given_std is not None else survey.std
        if self.given_std is None and any(value <= 0 for value in std):  # a given one: DataSpec refuses it
            raise DataFormatError(
                f"The training images of {self.root / 'train'} have a channel of one constant value (std {list(std)}), "
                "which cannot be normalized: give data.std (and data.mean) yourself."
            )
        return DataSpec(tuple(self._class_names), survey.input_shape, mean, std)

    @override
    def prepare_data(self) -> None:
        # Before any DDP process launches (the training command calls this first): every image
        # decoded and the survey kept, so the processes read it instead of decoding everything.
        _ = self.spec

    @override
    def check_splits(self) -> None:
        """Refuse a ``val_size`` that leaves no training or no validation image (nothing to check
        with a ``val/`` folder).

        Raises:
            ConfigValueError: naming ``data.val_size``, the folder and the counts.
        """
        self._train_and_val()

    @property
    def in_memory(self) -> bool:
        """Whether every split's decoded pixels fit under ``in_memory_limit_mib``."""
        count = sum(len(split.files) for split in self.splits.values())
        return count * math.prod(self.spec.input_shape) <= self.in_memory_limit_mib * 2**20

    def _dataset(self, split: FolderSplit) -> Dataset:
        """The split as a dataset: decoded into memory (:class:`GatherDataset`), or from disk per sample."""
        channels, size = self.spec.channels, self.spec.image_size
        if not self.in_memory:
            return FolderImages(split, channels, size)
        images = torch.stack([resized(decode_image_file(path, channels), size) for path in split.files])
        return GatherDataset(images, torch.tensor(split.labels, dtype=torch.int64))

    @override
    def setup(self, stage: str) -> None:
        if stage in ("fit", "validate") and self.train_set is None:
            train, val = self._train_and_val()
            self.train_set, self.val_set = self._dataset(train), self._dataset(val)
        if stage == "test" and self.test_set is None:
            self.test_set = self._dataset(self.splits["test"])
