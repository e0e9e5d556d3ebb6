"""The IDX file format of MNIST and its family: finding or downloading the four files, checking
them, and reading them into tensors.

A data set in this format is four files, two per split: ``(N, H, W)`` uint8 images (28x28 for
MNIST) and ``(N,)`` uint8 labels in ``0..C - 1`` for ``C`` classes (http://yann.lecun.com/exdb/mnist/,
"the IDX file format").
Each file may be uncompressed or gzip-compressed, as MNIST and its family ship (``<name>.gz``): a
gzipped file is decompressed in memory as it is read, never onto disk, so the data folder may be
read-only (:func:`find_idx_file`).
"""

import contextlib
import importlib
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from ddp_engine.api import DataFormatError, DataNotAvailableError
from ddp_engine.vision.idx_format import (
    IMAGES_KIND,
    LABELS_KIND,
    check_header,
    check_idx_file,
    find_idx_file,
    open_idx,
    unreadable,
)

#: The four files of the original data set (http://yann.lecun.com/exdb/mnist/), uncompressed,
#: as torchvision expects them in ``<data_dir>/MNIST/raw/``, by the role each plays.
MNIST_FILES = {
    "train_images": "train-images-idx3-ubyte",
    "train_labels": "train-labels-idx1-ubyte",
    "test_images": "t10k-images-idx3-ubyte",
    "test_labels": "t10k-labels-idx1-ubyte",
}


#: Where a class that downloads IDX files may come from: torchvision's data sets, nothing else is
#: imported for a config's ``download`` (a run folder's saved config among them).
DOWNLOADERS = "torchvision.datasets."


def import_class(path: str) -> type:
    """``"torchvision.datasets.MNIST"`` -> the class, for a path under :data:`DOWNLOADERS` only.
    (Hydra's ``get_class`` would do, but it logs an error of its own before raising.)

    Raises:
        ImportError, AttributeError, ValueError: for a path that names no class, or one outside
            torchvision's data sets (nothing is imported then).
    """
    if not path.startswith(DOWNLOADERS):
        raise ValueError(f"{path} is not a class of {DOWNLOADERS.rstrip('.')}")
    module, _, name = path.rpartition(".")
    found = getattr(importlib.import_module(module), name)
    if not isinstance(found, type):
        raise ValueError(f"{path} is not a class")
    return found


def ensure_idx_files(raw_dir: Path, files: Sequence[str], download: str | None = "torchvision.datasets.MNIST") -> Path:
    """Make sure ``raw_dir`` holds every file of ``files``, uncompressed or gzipped
    (:func:`find_idx_file`), downloading them if needed.

    Args:
        raw_dir: the folder that holds, or will receive, the files.
        files: their names (uncompressed; ``<name>.gz`` is found too).
        download: import path of a torchvision data set class of the MNIST family
            (``torchvision.datasets.MNIST``, ``FashionMNIST``, ``KMNIST``) that fetches the files
            (and checks each archive's MD5), or None for a data set that cannot be downloaded.
            It downloads into a temporary folder inside ``raw_dir``, created first: a folder
            this user cannot write is refused before anything is fetched. The files are moved
            into place only once all of them are complete, so an interrupted or failed download
            never leaves a partial file behind (nor the folders it created).

    Returns:
        ``raw_dir``.

    Raises:
        DataNotAvailableError: if the folder cannot be read, or files are missing and cannot be
            downloaded (``download`` is None, the folder cannot be written, no network). The
            message names the folder and the files.
    """
    raw = Path(raw_dir)
    try:
        missing = [name for name in files if not find_idx_file(raw, name).is_file()]
    except PermissionError as err:
        raise unreadable(raw, "chmod a+rx on the folders, a+r on the files") from err
    if not missing:
        return raw
    not_found = f"{', '.join(missing)} not found in {raw} (nor as .gz)"
    put_them = f"Put the files {', '.join(files)} (uncompressed or .gz) into {raw}"
    if download is None:
        raise DataNotAvailableError(
            f"{not_found}, and this data set has no download (data.download=null). "
            f"{put_them}, or point data.data_dir (and data.subdir) at a folder that has them."
        )
    dataset_class = import_class(download)
    lineage = [raw, *raw.parents]
    # The innermost folder that exists, which must be writable; the outermost one this call creates,
    # removed again if the download fails.
    existing = next(folder for folder in lineage if folder.exists())
    created = next((folder for folder in reversed(lineage) if not folder.exists()), None)
    with _removed_on_error(created):
        try:
            raw.mkdir(parents=True, exist_ok=True)
            tmp = tempfile.TemporaryDirectory(prefix=".download-", dir=raw)
        except OSError as err:
            raise DataNotAvailableError(
                f"{not_found}, and they cannot be downloaded there: {existing} cannot be written "
                f"({err.strerror or err}). {put_them}, or point data.data_dir at a folder you can write."
            ) from None
        try:
            with tmp:
                dataset_class(tmp.name, train=True, download=True)
                fetched = Path(tmp.name) / dataset_class.__name__ / "raw"  # torchvision's layout: <root>/<class>/raw
                for name in files:
                    (fetched / name).replace(raw / name)
        # Whatever the download raised: URLError (no network), http.client.IncompleteRead (a transfer
        # cut off), RuntimeError (an archive whose MD5 does not match), OSError (a full disk).
        except Exception as err:
            raise DataNotAvailableError(
                f"{dataset_class.__name__} is missing from {raw} ({', '.join(missing)} not found, nor as .gz) and "
                f"could not be downloaded: {(str(err).strip() or type(err).__name__).splitlines()[-1]}. "
                f"{put_them}, or point data.data_dir (and data.subdir) at a folder that has them, "
                f"or run once on a machine with internet access."
            ) from err
    return raw


@contextlib.contextmanager
def _removed_on_error(folder: Path | None) -> Iterator[None]:
    """Remove ``folder`` (unless None) when the block raises, then let the error through."""
    try:
        yield
    except BaseException:
        if folder is not None:
            shutil.rmtree(folder, ignore_errors=True)
        raise


def ensure_mnist_files(data_dir: Path) -> Path:
    """:func:`ensure_idx_files` for MNIST itself: the four files in ``data_dir/MNIST/raw/``."""
    return ensure_idx_files(Path(data_dir) / "MNIST" / "raw", list(MNIST_FILES.values()))


def check_idx_split(
    images_file: Path,
    labels_file: Path,
    num_classes: int,
    images_shape: tuple[int, ...] | None = None,
    image_size: Sequence[int] | None = None,
) -> Tensor:
    """Check one split's two IDX files without holding the images in memory: their headers and
    sizes, the sample counts, the labels (small: one byte per sample), and, given ``image_size``,
    the image size.

    Args:
        images_file, labels_file: the split's files.
        num_classes: labels must be ``0..num_classes - 1``.
        images_shape: the images' shape when they have been read already (their header and size
            checked: :func:`read_idx_file`), so that the images file is not read again.
        image_size: ``(H, W)`` the images must have (``data.image_size``).

    Returns:
        The labels, ``(N,)`` int64 in ``0..num_classes - 1``.

    Raises:
        DataNotAvailableError: when a file cannot be read (see :func:`check_idx_file`).
        DataFormatError: naming the file, when a file is not an IDX file of the expected kind
            (images: 3 dimensions, uint8; labels: 1 dimension, uint8), is truncated, or is a
            truncated or corrupt gzip file (see :func:`check_idx_file`), the images are not of
            ``image_size``, the two files hold different numbers of samples, or a label is
            outside the classes.
    """
    count, *size = images_shape or check_idx_file(images_file, 3, IMAGES_KIND)
    if image_size is not None and tuple(size) != tuple(image_size):
        raise DataFormatError(
            f"{images_file} holds {size[0]}x{size[1]} images; data.image_size is {image_size[0]}x{image_size[1]}. "
            f"Set data.image_size=[{size[0]},{size[1]}] if that is the data set's size (both splits need one size)."
        )
    labels = read_idx_file(labels_file, 1, LABELS_KIND).long()
    if count != len(labels):
        raise DataFormatError(f"{images_file} holds {count} images but {labels_file} {len(labels)} labels.")
    if len(labels) and not 0 <= int(labels.min()) <= int(labels.max()) < num_classes:
        raise DataFormatError(
            f"{labels_file} has labels {int(labels.min())}..{int(labels.max())}; data.class_names names "
            f"{num_classes} classes (labels 0..{num_classes - 1})."
        )
    return labels


def read_idx_split(images_file: Path, labels_file: Path, num_classes: int) -> tuple[Tensor, Tensor]:
    """Read one split's images and labels from their IDX files (uncompressed or gzipped), with the
    checks of :func:`check_idx_split` (whose errors it raises).

    Returns:
        images ``(N, H, W)`` uint8 and labels ``(N,)`` int64 in ``0..num_classes - 1``.
    """
    images = read_idx_file(images_file, 3, IMAGES_KIND)  # read once, a gzipped file decompressed once
    return images, check_idx_split(images_file, labels_file, num_classes, tuple(images.shape))


def read_idx_file(path: Path, ndim: int, kind: str) -> Tensor:
    """Read an IDX file of uint8 values (uncompressed, or gzipped: decompressed in memory), after
    the checks of :func:`check_header` on its content. (torchvision's IDX reader opens the path
    itself, so it reads uncompressed files only.)

    Returns:
        The values, uint8, in the shape its header announces.

    Raises:
        DataNotAvailableError, DataFormatError: see :func:`open_idx` and :func:`check_header`.
    """
    with open_idx(path) as file:
        content = bytearray(file.read())
    offset = 4 + 4 * ndim
    shape = check_header(path, bytes(content[:offset]), len(content), ndim, kind)
    return torch.from_numpy(np.frombuffer(content, np.uint8, offset=offset).reshape(shape))
