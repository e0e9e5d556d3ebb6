"""The IDX file format of MNIST and its family: finding or downloading the four files, checking
them, and reading them into tensors.

A data set in this format is four files, two per split: ``(N, 28, 28)`` uint8 images and ``(N,)``
uint8 labels in ``0..NUM_CLASSES - 1`` (http://yann.lecun.com/exdb/mnist/, "the IDX file format").
"""

import importlib
import math
import os
import shutil
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

from torch import Tensor
from torchvision.datasets.mnist import read_image_file, read_label_file

from mnist_ddp.errors import DataFormatError, DataNotAvailableError

#: The number of classes: labels are ``0..9``; every network outputs that many logits.
NUM_CLASSES = 10

#: The four files of the original data set (http://yann.lecun.com/exdb/mnist/), uncompressed,
#: as torchvision expects them in ``<data_dir>/MNIST/raw/``, by the role each plays.
MNIST_FILES = {
    "train_images": "train-images-idx3-ubyte",
    "train_labels": "train-labels-idx1-ubyte",
    "test_images": "t10k-images-idx3-ubyte",
    "test_labels": "t10k-labels-idx1-ubyte",
}

#: The image size every network of this template takes (:mod:`mnist_ddp.models.networks`).
IMAGE_SIZE = (28, 28)


def import_class(path: str) -> type:
    """``"torchvision.datasets.MNIST"`` -> the class. (Hydra's ``get_class`` would do, but it logs
    an error of its own before raising.)

    Raises:
        ImportError, AttributeError, ValueError: for a path that names no class.
    """
    module, _, name = path.rpartition(".")
    found = getattr(importlib.import_module(module), name)
    if not isinstance(found, type):
        raise ValueError(f"{path} is not a class")
    return found


def ensure_idx_files(raw_dir: Path, files: Sequence[str], download: str | None = "torchvision.datasets.MNIST") -> Path:
    """Make sure ``raw_dir`` holds every file of ``files``, downloading them if needed.

    Args:
        raw_dir: the folder that holds, or will receive, the files.
        files: their names.
        download: import path of a torchvision data set class of the MNIST family
            (``torchvision.datasets.MNIST``, ``FashionMNIST``, ``KMNIST``) that fetches the files
            (and checks each archive's MD5), or None for a data set that cannot be downloaded.
            It downloads into a temporary folder beside ``raw_dir``; the files are moved into
            place only once all of them are complete, so an interrupted or failed download never
            leaves a partial file behind (nor the folders it created).

    Returns:
        ``raw_dir``.

    Raises:
        DataNotAvailableError: if the folder cannot be read, or files are missing and cannot be
            downloaded (no network, the folder is not writable, or ``download`` is None). The
            message names the folder and the files.
    """
    raw = Path(raw_dir)
    try:
        missing = [name for name in files if not (raw / name).is_file()]
    except PermissionError as err:
        raise unreadable(raw, "chmod a+rx on the folders, a+r on the files") from err
    if not missing:
        return raw
    if download is None:
        raise DataNotAvailableError(
            f"{', '.join(missing)} not found in {raw}, and this data set has no download (data.download=null). "
            f"Put the files {', '.join(files)} into {raw}, "
            "or point data.data_dir (and data.subdir) at a folder that has them."
        )
    dataset_class = import_class(download)
    # The outermost folder this call creates: removed again if the download fails.
    created = next((folder for folder in reversed([raw, *raw.parents]) if not folder.exists()), None)
    try:
        raw.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix=".download-", dir=raw.parent) as tmp:
            dataset_class(tmp, train=True, download=True)
            fetched = Path(tmp) / dataset_class.__name__ / "raw"  # torchvision's layout: <root>/<class>/raw
            raw.mkdir(exist_ok=True)
            for name in files:
                os.replace(fetched / name, raw / name)
    # Whatever the download raised: URLError (no network), http.client.IncompleteRead (a transfer cut
    # off), RuntimeError (an archive whose MD5 does not match), OSError (a folder not writable).
    except Exception as err:
        if created is not None:
            shutil.rmtree(created, ignore_errors=True)
        raise DataNotAvailableError(
            f"{dataset_class.__name__} is missing from {raw} ({', '.join(missing)} not found) and could not be "
            f"downloaded: {(str(err).strip() or type(err).__name__).splitlines()[-1]}\n"
            f"Put the uncompressed IDX files {', '.join(files)} into {raw}, "
            f"or point data.data_dir (and data.subdir) at a folder that has them, "
            f"or run once on a machine with internet access."
        ) from err
    return raw


def unreadable(path: Path, fix: str) -> DataNotAvailableError:
    """The error for a data file or folder this user may not read, with the ``chmod`` that fixes it."""
    return DataNotAvailableError(
        f"{path} cannot be read: permission denied. Make it readable for this user ({fix}), "
        "or point data.data_dir at a readable copy."
    )


def ensure_mnist_files(data_dir: Path) -> Path:
    """:func:`ensure_idx_files` for MNIST itself: the four files in ``data_dir/MNIST/raw/``."""
    return ensure_idx_files(Path(data_dir) / "MNIST" / "raw", list(MNIST_FILES.values()))


IMAGES_KIND, LABELS_KIND = "uint8 images (N, 28, 28)", "uint8 labels (N,)"


def check_idx_split(images_file: Path, labels_file: Path, num_classes: int) -> Tensor:
    """Check one split's two IDX files without reading the images: their headers and sizes, the
    image size, the sample counts, and the labels (small: one byte per sample).

    Returns:
        The labels, ``(N,)`` int64 in ``0..num_classes - 1``.

    Raises:
        DataNotAvailableError: when a file cannot be read (see :func:`check_idx_file`).
        DataFormatError: naming the file, when a file is not an IDX file of the expected kind
            (images: 3 dimensions, uint8; labels: 1 dimension, uint8) or is truncated (see
            :func:`check_idx_file`), the images are not 28x28, the two files hold different
            numbers of samples, or a label is outside the classes.
    """
    count, *size = check_idx_file(images_file, 3, IMAGES_KIND)
    if tuple(size) != IMAGE_SIZE:
        raise DataFormatError(
            f"{images_file} holds {size[0]}x{size[1]} images; this template's networks take {IMAGE_SIZE[0]}x"
            f"{IMAGE_SIZE[1]} (resize the data set, or change the networks in mnist_ddp/models/networks.py)."
        )
    labels = _read_idx(read_label_file, labels_file, 1, LABELS_KIND)
    if count != len(labels):
        raise DataFormatError(f"{images_file} holds {count} images but {labels_file} {len(labels)} labels.")
    if len(labels) and not 0 <= int(labels.min()) <= int(labels.max()) < num_classes:
        raise DataFormatError(
            f"{labels_file} has labels {int(labels.min())}..{int(labels.max())}; data.class_names names "
            f"{num_classes} classes (labels 0..{num_classes - 1})."
        )
    return labels


def read_idx_split(images_file: Path, labels_file: Path, num_classes: int) -> tuple[Tensor, Tensor]:
    """Read one split's images and labels from their IDX files, with torchvision's IDX reader,
    after :func:`check_idx_split` (whose errors it raises).

    Returns:
        images ``(N, 28, 28)`` uint8 and labels ``(N,)`` int64 in ``0..num_classes - 1``.
    """
    labels = check_idx_split(images_file, labels_file, num_classes)
    return _read_idx(read_image_file, images_file, 3, IMAGES_KIND), labels


def check_idx_file(path: Path, ndim: int, kind: str) -> tuple[int, ...]:
    """Check an IDX file's header against the file's size, before anything reads its data.

    The IDX format (http://yann.lecun.com/exdb/mnist/, "the IDX file format"): two zero bytes, a
    type byte (0x08: uint8), the number of dimensions, one big-endian uint32 size per dimension,
    then the values. torchvision's reader checks the header with ``assert`` and a truncated file
    only fails in its final reshape, so these checks come first and say what is wrong.

    Args:
        path: the file.
        ndim: the dimensions it must have (3: images ``(N, 28, 28)``, 1: labels ``(N,)``).
        kind: what it holds, for the messages (``"uint8 images (N, 28, 28)"``).

    Returns:
        The shape its header announces.

    Raises:
        DataNotAvailableError: when the file cannot be read (permissions).
        DataFormatError: for another magic number (another type, another number of dimensions, a
            gzip archive), a file shorter than its header announces (truncated) or longer (not one
            IDX file).
    """
    expected_magic = bytes([0, 0, 0x08, ndim])
    try:
        size = path.stat().st_size
        with open(path, "rb") as file:
            header = file.read(4 + 4 * ndim)
    except PermissionError as err:
        raise unreadable(path, "chmod a+r") from err
    if header[:2] == b"\x1f\x8b":
        name = path.name
        raise DataFormatError(
            f"{path} is gzip-compressed: decompress it in place (mv {name} {name}.gz && gunzip {name}.gz)."
        )
    if len(header) < 4 or header[:4] != expected_magic:
        raise DataFormatError(
            f"{path} is not an IDX file of {kind}: it starts with 0x{header[:4].hex()} instead of the magic "
            f"number 0x{expected_magic.hex()} (uint8, {ndim} dimension{'s' * (ndim > 1)})."
        )
    if len(header) < 4 + 4 * ndim:
        raise DataFormatError(f"{path} is truncated: {size} bytes, less than its own header.")
    shape = tuple(int.from_bytes(header[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim))
    announced = 4 + 4 * ndim + math.prod(shape)
    if size != announced:
        what = f"{' x '.join(map(str, shape))} values ({announced:,} bytes with the header)"
        if size < announced:
            raise DataFormatError(
                f"{path} is truncated: its header announces {what}, the file has {size:,} bytes. "
                "Copy or download it again (with data.download set, delete it and the next run downloads it)."
            )
        raise DataFormatError(f"{path} has {size - announced:,} bytes more than the {what} its header announces.")
    return shape


def _read_idx(reader: Callable[[str], Tensor], path: Path, ndim: int, kind: str) -> Tensor:
    check_idx_file(path, ndim, kind)
    try:
        return reader(str(path))
    # What the header check cannot see: torchvision's reader checks the header with assert and
    # the dtype and dimensions with TypeError / ValueError.
    except (AssertionError, KeyError, RuntimeError, TypeError, ValueError) as err:
        raise DataFormatError(f"{path} is not an IDX file of {kind}: {err or type(err).__name__}") from err
