"""The inputs of ``python -m mnist_ddp.predict``: a folder of PNG or JPEG images, one such image, or
an IDX images file (uncompressed or gzipped), found, checked and read.

Every image must be what the networks take: 28x28 pixels (:data:`~mnist_ddp.data.idx.IMAGE_SIZE`),
in the gray levels of the data set the model was trained on (MNIST: a white digit on black, as its
IDX files hold them). A colour image is read as gray (torchvision's ``ImageReadMode.GRAY``), a
16-bit one scaled to 8 bits; an image of another size is refused, not resized, since how to bring
it to 28x28 (crop, pad, scale) changes what the model sees, and is the user's choice.

An input is named by its path relative to the folder (``/``-separated), its file name, or its index
in the IDX file; the inputs are in the order of those names (sorted paths, or the file's order),
which is the order of the predictions.
"""

import re
from pathlib import Path

import torch
from torch import Tensor
from torch.utils.data import Dataset
from torchvision.io import ImageReadMode, decode_image
from torchvision.transforms.v2.functional import to_dtype

from mnist_ddp.data.datamodule import normalize
from mnist_ddp.data.idx import IMAGE_SIZE, IMAGES_KIND, check_idx_file, check_image_size, read_idx_file
from mnist_ddp.errors import ConfigValueError, DataFormatError, DataNotAvailableError, first_line

#: The file name suffixes of the images read (any case); every other file in a folder is left out.
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg")


def is_image_file(path: Path) -> bool:
    """Whether ``path`` names a PNG or JPEG image by its suffix (:data:`IMAGE_SUFFIXES`)."""
    return path.suffix.lower() in IMAGE_SUFFIXES


def list_inputs(path: Path) -> list[str]:
    """The names of the inputs at ``path``, in the order of their predictions.

    Args:
        path: a folder (every PNG or JPEG file in it and its subfolders, by its path relative to
            ``path``, sorted), a PNG or JPEG file (its name), or an IDX file of ``(N, 28, 28)``
            uint8 images, uncompressed or gzipped (``"0"`` .. ``"N-1"``). The images of a folder
            are not decoded here (:func:`check_inputs` does).

    Raises:
        DataNotAvailableError: when ``path`` does not exist or cannot be read.
        DataFormatError: for a folder that holds no image, and for a file that is neither an
            image by its suffix nor an IDX file of 28x28 images (named, with what it holds).
    """
    path = Path(path)
    if not path.exists():
        raise DataNotAvailableError(
            f"input={path}: no such file or folder. Pass a folder of PNG or JPEG images, or an IDX images file."
        )
    try:
        if path.is_dir():
            files = sorted(file.relative_to(path).as_posix() for file in path.rglob("*") if file.is_file())
        elif is_image_file(path):
            return [path.name]
        else:
            count, *size = check_idx_file(path, 3, IMAGES_KIND)
            check_image_size(path, size)
            return [str(index) for index in range(count)]
    except PermissionError as error:
        raise DataNotAvailableError(
            f"input={path} cannot be read: permission denied ({error.filename}). Make it readable for this user "
            "(chmod a+rx on folders, a+r on files)."
        ) from None
    images = [name for name in files if is_image_file(Path(name))]
    if not images:
        others = f" (it holds {len(files)} other file{'s' * (len(files) > 1)}, such as {files[0]})" if files else ""
        raise DataFormatError(
            f"input={path} holds no PNG or JPEG image ({', '.join(IMAGE_SUFFIXES)}, in it or its subfolders)"
            f"{others}. Point input at a folder of 28x28 grayscale images, or at an IDX images file."
        )
    return images


def decode(file: Path) -> Tensor:
    """Read one image file as the networks take it.

    Returns:
        Its pixels, ``(28, 28)`` uint8 gray levels (colour converted to gray, 16 bits scaled to 8).

    Raises:
        DataNotAvailableError: when the file cannot be read.
        DataFormatError: naming the file, when it cannot be decoded as an image, or it is not 28x28.
    """
    try:
        content = torch.frombuffer(bytearray(Path(file).read_bytes()), dtype=torch.uint8)
    except OSError as error:
        raise DataNotAvailableError(f"{file} cannot be read ({error.strerror or error}).") from None
    try:
        image = decode_image(content, mode=ImageReadMode.GRAY)
    except RuntimeError as error:
        # torchvision prefixes its reason with the C++ function, file and line: left out.
        reason = re.sub(r"^.*?\.cpp:\d+, ", "", first_line(error))
        raise DataFormatError(
            f"{file} cannot be decoded as an image ({reason}). Replace it with a PNG or JPEG image, or remove it."
        ) from None
    if tuple(image.shape[1:]) != IMAGE_SIZE:
        height, width = image.shape[1:]
        raise DataFormatError(
            f"{file} is {height}x{width} pixels; the model takes {IMAGE_SIZE[0]}x{IMAGE_SIZE[1]} grayscale images "
            "as its data set holds them. Resize or crop it to that size (as the training images were made), "
            "or remove it."
        )
    return to_dtype(image[0], torch.uint8, scale=True)


def check_inputs(path: Path, world_size: int) -> list[str]:
    """Check the inputs at ``path`` before any process starts: found (:func:`list_inputs`), every
    image file decoded (:func:`decode`; an IDX file's header and size were checked by the listing),
    and at least one for each of the ``world_size`` replicas.

    Returns:
        Their names (:func:`list_inputs`).

    Raises:
        DataNotAvailableError, DataFormatError: see :func:`list_inputs` and :func:`decode`.
        ConfigValueError: for fewer inputs than replicas, naming the process count that fits.
    """
    names = list_inputs(path)
    for file in image_files(path, names) or []:
        decode(file)
    if len(names) < world_size:
        raise ConfigValueError(
            f"input={path} holds {len(names)} input{'s' * (len(names) > 1)}, fewer than the world_size={world_size} "
            f"processes that would share them, each of which must predict one. Predict with at most {len(names)} "
            f"(trainer.devices={len(names)})."
        )
    return names


def image_files(path: Path, names: list[str]) -> list[Path] | None:
    """The files of the inputs ``names`` (:func:`list_inputs`) at ``path``; None for an IDX file,
    whose images are not files."""
    path = Path(path)
    if path.is_dir():
        return [path / name for name in names]
    return [path] if is_image_file(path) else None


class InputImages(Dataset):
    """The inputs at ``path`` (:func:`list_inputs`) as the model takes them, served a batch at a time.

    Each batch is ``(images,)``: ``(B, 1, 28, 28)`` float32, normalized as the training images were,
    ``(pixel / 255 - mean) / std`` (:func:`~mnist_ddp.data.datamodule.normalize`). An IDX file is read
    whole once (a few MB); image files are decoded as their batch is served, so that each replica
    decodes only its own shard. Like the DataModule's datasets it serves whole batches
    (``__getitems__``): a DataLoader over it needs ``collate_fn=default_convert``.

    Args:
        path: the folder, image file or IDX file.
        mean: the training pixels' mean on a 0..1 scale (``data.mean`` of the checkpoint's run).
        std: their standard deviation (``data.std``).

    Raises:
        DataNotAvailableError, DataFormatError: see :func:`list_inputs` and :func:`decode`.
    """

    def __init__(self, path: Path, mean: float, std: float) -> None:
        self.path, self.mean, self.std = Path(path), mean, std
        self.names = list_inputs(self.path)
        self.files = image_files(self.path, self.names)
        self.pixels = read_idx_file(self.path, 3, IMAGES_KIND) if self.files is None else None

    def __len__(self) -> int:
        return len(self.names)

    def __getitems__(self, indices: list[int]) -> tuple[Tensor]:
        """``indices``: the batch's ``B`` input indices -> ``(images,)``, ``(B, 1, 28, 28)`` float32."""
        if self.pixels is not None:
            pixels = self.pixels[torch.as_tensor(indices, dtype=torch.int64)]
        else:
            pixels = torch.stack([decode(self.files[index]) for index in indices])
        return (normalize(pixels, self.mean, self.std),)
