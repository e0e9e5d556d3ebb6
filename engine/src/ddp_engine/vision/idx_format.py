"""The IDX file format of MNIST and its family, without torch: finding a file (uncompressed or
gzipped), opening it, and checking its header against its size. What reads the values into tensors
is :mod:`ddp_engine.vision.idx`; a data set's schema reads a header here before torch is imported.

An IDX file (http://yann.lecun.com/exdb/mnist/, "the IDX file format"): ``(N, H, W)`` uint8 images
or ``(N,)`` uint8 labels, uncompressed or gzip-compressed as MNIST and its family ship
(``<name>.gz``), decompressed in memory as it is read, never onto disk.
"""

import contextlib
import gzip
import io
import math
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from ddp_engine.api import DataFormatError, DataNotAvailableError, first_line

#: What the two files of a split hold, for the messages.
IMAGES_KIND, LABELS_KIND = "uint8 images (N, H, W)", "uint8 labels (N,)"


def find_idx_file(folder: Path, name: str) -> Path:
    """The file ``name`` in ``folder``, uncompressed or as shipped: ``folder / name`` if it is a
    file, else ``folder / (name + ".gz")`` if that is one, else ``folder / name`` (missing: the
    errors then name it).

    When both are there the uncompressed one is read: it is what a user who decompressed the
    archive meant, and reads without decompressing. Whether a file is gzip-compressed is told by
    its first bytes, not its name (:func:`open_idx`), so a ``.gz`` that a browser already
    decompressed reads as well.

    Raises:
        PermissionError: when ``folder`` cannot be searched.
    """
    for candidate in (folder / name, folder / f"{name}.gz"):
        if candidate.is_file():
            return candidate
    return folder / name


def unreadable(path: Path, fix: str) -> DataNotAvailableError:
    """The error for a data file or folder this user may not read, with the ``chmod`` that fixes it."""
    return DataNotAvailableError(
        f"{path} cannot be read: permission denied. Make it readable for this user ({fix}), "
        "or point data.data_dir at a readable copy."
    )


#: The first two bytes of every gzip file (RFC 1952).
GZIP_MAGIC = b"\x1f\x8b"


@contextlib.contextmanager
def open_idx(path: Path) -> Iterator[BinaryIO]:
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
        DataNotAvailableError, DataFormatError: see :func:`open_idx` and :func:`check_header`.
    """
    with open_idx(path) as file:
        header = file.read(4 + 4 * ndim)
        if isinstance(file, gzip.GzipFile):
            size = len(header) + sum(iter(lambda: len(file.read(1 << 20)), 0))
        else:
            size = file.seek(0, io.SEEK_END)
    return check_header(path, header, size, ndim, kind)


def check_header(path: Path, header: bytes, size: int, ndim: int, kind: str) -> tuple[int, ...]:
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
