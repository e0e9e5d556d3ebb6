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
import gzip
import importlib
import io
import math
import shutil
import tempfile
import zlib
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import BinaryIO

import numpy as np
import torch
from torch import Tensor

from ddp_engine.api import DataFormatError, DataNotAvailableError, first_line

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


def find_idx_file(folder: Path, name: str) -> Path:
    """The file ``name`` in ``folder``, uncompressed or as shipped: ``folder / name`` if it is a
    file, else ``folder / (name + ".gz")`` if that is one, else ``folder / name`` (missing: the
    errors then name it).

    When both are there the uncompressed one is read: it is what a user who decompressed the
    archive meant, and reads without decompressing. Whether a file is gzip-compressed is told by
    its first bytes, not its name (:func:`_open_idx`), so a ``.gz`` that a browser already
    decompressed reads as well.

    Raises:
        PermissionError: when ``folder`` cannot be searched.
    """
    for candidate in (folder / name, folder / f"{name}.gz"):
        if candidate.is_file():
            return candidate
    return folder / name


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


def unreadable(path: Path, fix: str) -> DataNotAvailableError:
    """The error for a data file or folder this user may not read, with the ``chmod`` that fixes it."""
    return DataNotAvailableError(
        f"{path} cannot be read: permission denied. Make it readable for this user ({fix}), "
        "or point data.data_dir at a readable copy."
    )


def ensure_mnist_files(data_dir: Path) -> Path:
    """:func:`ensure_idx_files` for MNIST itself: the four files in ``data_dir/MNIST/raw/``."""
    return ensure_idx_files(Path(data_dir) / "MNIST" / "raw", list(MNIST_FILES.values()))


IMAGES_KIND, LABELS_KIND = "uint8 images (N, H, W)", "uint8 labels (N,)"


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


#: The first two bytes of every gzip file (RFC 1952).
GZIP_MAGIC = b"\x1f\x8b"


@contextlib.contextmanager
def _open_idx(path: Path) -> Iterator[BinaryIO]:
    """``path`` opened for reading its content: decompressed as it is read when the file is
    gzip-compressed (its first bytes are gzip's magic number, whatever its name), as is otherwise.

    Raises:
        DataNotAvailableError: when the file cannot be read (permissions).
        DataFormatError: when reading the decompressed content fails, for a gzip file that is
            truncated or corrupt (``gzip.BadGzipFile``, ``EOFError``, ``zlib.error``).
    """
    try:
        with open(path, "rb") as file:
            compressed = file.read(len(GZIP_MAGIC)) == GZIP_MAGIC
        with gzip.open(path, "rb") if compressed else open(path, "rb") as file:
            yield file
    except PermissionError as err:
        raise unreadable(path, "chmod a+r") from err
    except (gzip.BadGzipFile, EOFError, zlib.error) as err:
        raise DataFormatError(
            f"{path} is a truncated or corrupt gzip file ({first_line(err)}). Copy or download it again "
            "(with data.download set, delete it and the next run downloads it)."
        ) from err


def check_idx_file(path: Path, ndim: int, kind: str) -> tuple[int, ...]:
    """Check an IDX file's header against the size of its content without holding the content
    in memory (a gzipped file is decompressed in chunks to count its bytes).

    Returns:
        The shape its header announces.

    Raises:
        DataNotAvailableError, DataFormatError: see :func:`_open_idx` and :func:`_check_header`.
    """
    with _open_idx(path) as file:
        header = file.read(4 + 4 * ndim)
        if isinstance(file, gzip.GzipFile):
            size = len(header) + sum(iter(lambda: len(file.read(1 << 20)), 0))
        else:
            size = file.seek(0, io.SEEK_END)
    return _check_header(path, header, size, ndim, kind)


def read_idx_file(path: Path, ndim: int, kind: str) -> Tensor:
    """Read an IDX file of uint8 values (uncompressed, or gzipped: decompressed in memory), after
    the checks of :func:`_check_header` on its content. (torchvision's IDX reader opens the path
    itself, so it reads uncompressed files only.)

    Returns:
        The values, uint8, in the shape its header announces.

    Raises:
        DataNotAvailableError, DataFormatError: see :func:`_open_idx` and :func:`_check_header`.
    """
    with _open_idx(path) as file:
        content = bytearray(file.read())
    offset = 4 + 4 * ndim
    shape = _check_header(path, bytes(content[:offset]), len(content), ndim, kind)
    return torch.from_numpy(np.frombuffer(content, np.uint8, offset=offset).reshape(shape))


def _check_header(path: Path, header: bytes, size: int, ndim: int, kind: str) -> tuple[int, ...]:
    """Check the header of an IDX file's content against the content's size, before anything reads
    its data.

    The IDX format (http://yann.lecun.com/exdb/mnist/, "the IDX file format"): two zero bytes, a
    type byte (0x08: uint8), the number of dimensions, one big-endian uint32 size per dimension,
    then the values. Every check is on the content (a gzipped file's decompressed bytes), so that
    the reader's reshape cannot fail and each message says what is wrong.

    Args:
        path: the file, for the messages.
        header: the content's first ``4 + 4 * ndim`` bytes (fewer when the content is shorter).
        size: the content's size in bytes.
        ndim: the dimensions it must have (3: images ``(N, H, W)``, 1: labels ``(N,)``).
        kind: what it holds, for the messages (``"uint8 images (N, H, W)"``).

    Returns:
        The shape the header announces.

    Raises:
        DataFormatError: for another magic number (another type, another number of dimensions, a
            file gzipped twice), content shorter than its header announces (truncated) or longer
            (not one IDX file).
    """
    expected_magic = bytes([0, 0, 0x08, ndim])
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
