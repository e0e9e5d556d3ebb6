"""The inputs of ``python -m <package>.predict``: a folder of PNG or JPEG images, one such image, or
an IDX images file (uncompressed or gzipped), found, checked and read.

Every image must be what the model takes: its data set's image shape ``(C, H, W)`` (the
checkpoint's :class:`~ddp_engine.vision.spec.DataSpec`), in the pixel values of that data set (MNIST:
a white digit on black, as its IDX files hold them). An image of another size or channel count is
refused, not converted, since how to bring it to the model's shape (crop, pad, scale; which colour
to keep) changes what the model sees and is the user's choice; with ``resize=true`` every input is
converted to the model's channels (Pillow's conversion: RGB to gray by luma, gray to RGB by copying)
and resized to its size (bilinear, antialiased) instead. A 16-bit image is scaled to 8 bits.

An input is named by its path relative to the folder (``/``-separated), its file name, or its index
in the IDX file; the inputs are in the order of those names (sorted paths, or the file's order),
which is the order of the predictions.
"""

from pathlib import Path
from typing import Any

import torch
from torch import Tensor
from torch.utils.data import Dataset

from ddp_engine.api import ConfigValueError, DataFormatError, DataNotAvailableError
from ddp_engine.vision.idx import IMAGES_KIND, check_idx_file, read_idx_file
from ddp_engine.vision.images import IMAGE_SUFFIXES, converted, decode_image_file, is_image_file, resized
from ddp_engine.vision.input_path import check_input_path
from ddp_engine.vision.spec import DataSpec


def list_inputs(path: Path) -> list[str]:
    """The names of the inputs at ``path``, in the order of their predictions.

    Args:
        path: a folder (every PNG or JPEG file in it and its subfolders but hidden ones, by its
            path relative to ``path``, sorted), a PNG or JPEG file (its name), or an IDX file of ``(N, H, W)`` uint8
            images, uncompressed or gzipped (``"0"`` .. ``"N-1"``). Nothing is decoded here
            (:func:`check_inputs` does).

    Raises:
        DataNotAvailableError: when ``path`` does not exist or cannot be read.
        DataFormatError: for a folder that holds no image, and for a file that is neither an
            image by its suffix nor an IDX images file (named, with what it holds).
    """
    path = Path(path)
    check_input_path(path)
    try:
        if path.is_dir():
            files = sorted(file.relative_to(path).as_posix() for file in path.rglob("*") if file.is_file())
        elif is_image_file(path):
            return [path.name]
        else:
            count, *_ = check_idx_file(path, 3, IMAGES_KIND)
            return [str(index) for index in range(count)]
    except PermissionError as error:
        raise DataNotAvailableError(
            f"input={path} cannot be read: permission denied ({error.filename}). Make it readable for this user "
            "(chmod a+rx on folders, a+r on files)."
        ) from None
    # Hidden files left out, as data=folder leaves them out (such as the ._photo.png macOS writes beside copies).
    images = [name for name in files if is_image_file(Path(name)) and not Path(name).name.startswith(".")]
    if not images:
        others = f" (it holds {len(files)} other file{'s' * (len(files) > 1)}, such as {files[0]})" if files else ""
        raise DataFormatError(
            f"input={path} holds no PNG or JPEG image ({', '.join(IMAGE_SUFFIXES)}, in it or its subfolders)"
            f"{others}. Point input at a folder of images like the training images, or at an IDX images file."
        )
    return images


def _shape_text(shape: tuple[int, ...]) -> str:
    channels, height, width = shape
    kind = {1: "gray", 2: "gray + alpha", 3: "RGB", 4: "RGB + alpha"}.get(channels, f"{channels}-channel")
    return f"{height}x{width} {kind}"


def fit_to_model(pixels: Tensor, spec: DataSpec, name: str, resize: bool) -> Tensor:
    """``pixels`` ``(C, H, W)`` uint8 of the input ``name`` as the model takes them: the same when
    they have its shape, converted and resized with ``resize``, else refused.

    Raises:
        DataFormatError: naming the input, its shape, the model's and the fix.
    """
    if tuple(pixels.shape) == spec.input_shape:
        return pixels
    if not resize:
        raise DataFormatError(
            f"{name}: {_shape_text(tuple(pixels.shape))}, and the model takes {_shape_text(spec.input_shape)} "
            "images, as its data set holds them. Bring it to that shape (as the training images were made), or "
            "pass resize=true to convert and resize every input."
        )
    return resized(converted(pixels, spec.channels), spec.image_size)


def check_predict_job(cfg: Any, model: Any, world_size: int) -> None:
    """``task.predict.check_job`` of the image classifier: :func:`check_inputs` of ``cfg.input`` for
    the classes, image shape and normalization the model was built for (``model.data_spec``)."""
    check_inputs(Path(cfg.input), world_size, model.data_spec, cfg.resize)


def check_inputs(path: Path, world_size: int, spec: DataSpec, resize: bool = False) -> list[str]:
    """Check the inputs at ``path`` before any process starts: found (:func:`list_inputs`), every
    image decoded and of the model's shape (:func:`fit_to_model`), and at least one for each of the
    ``world_size`` replicas.

    Returns:
        Their names (:func:`list_inputs`).

    Raises:
        DataNotAvailableError, DataFormatError: see :func:`list_inputs`, :func:`fit_to_model` and
            :func:`~ddp_engine.vision.images.decode_image_file`.
        ConfigValueError: for fewer inputs than replicas, naming the process count that fits.
    """
    images = InputImages(path, spec, resize)
    for index in range(len(images)) if images.files is not None else ():
        images.pixels_of(index)
    if images.files is None and len(images):  # an IDX file: one shape for all its images
        fit_to_model(images.pixels[0], spec, f"input={path} (its images)", resize)
    names = images.names
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

    Each batch is ``(images,)``: ``(B, C, H, W)`` float32, normalized as the training images were
    (:meth:`~ddp_engine.vision.spec.DataSpec.normalize`). An IDX file is read whole once (a few MB);
    image files are decoded as their batch is served, so that each replica decodes only its own
    shard. It serves whole batches (``__getitems__``), as a
    :class:`~ddp_engine.data.sharded.GatherDataset` does: a DataLoader over it needs
    ``collate_fn=default_convert``.

    Args:
        path: the folder, image file or IDX file.
        spec: the data set the model was trained on (the checkpoint's): shape and normalization.
        resize: convert and resize inputs of another shape (default False: refused; see :func:`fit_to_model`).

    Raises:
        DataNotAvailableError, DataFormatError: see :func:`list_inputs` and :func:`fit_to_model`.
    """

    def __init__(self, path: Path, spec: DataSpec, resize: bool = False) -> None:
        self.path, self.spec, self.resize = Path(path), spec, resize
        self.names = list_inputs(self.path)
        self.files = image_files(self.path, self.names)
        self.pixels = read_idx_file(self.path, 3, IMAGES_KIND).unsqueeze(1) if self.files is None else None

    def __len__(self) -> int:
        return len(self.names)

    def pixels_of(self, index: int) -> Tensor:
        """Input ``index`` as the model takes it, ``(C, H, W)`` uint8 (not normalized)."""
        if self.files is not None:
            pixels, name = decode_image_file(self.files[index]), str(self.files[index])
        else:
            pixels, name = self.pixels[index], f"input={self.path}: image {index}"
        return fit_to_model(pixels, self.spec, name, self.resize)

    def __getitems__(self, indices: list[int]) -> tuple[Tensor]:
        """``indices``: the batch's ``B`` input indices -> ``(images,)``, ``(B, C, H, W)`` float32."""
        return (self.spec.normalize(torch.stack([self.pixels_of(index) for index in indices])),)
