"""Image files (PNG, JPEG) read as the networks take them: uint8 pixels ``(C, H, W)``.

Decoded by Pillow, the library torchvision's own ``ImageFolder`` reads with: it expands palette
images, reads 16-bit gray levels and CMYK JPEGs, and refuses a truncated file, where torchvision's
decoders return a palette image's indices as gray levels. The channel count is the image's own
(1 gray, 2 gray and alpha, 3 RGB, 4 RGB and alpha) unless a count is asked for, which converts.
"""

from pathlib import Path

import numpy as np
import torch
from PIL import Image, UnidentifiedImageError
from torch import Tensor
from torchvision.transforms.v2.functional import resize

from ddp_engine.api import DataFormatError, DataNotAvailableError, first_line

#: The file name suffixes of the images read (any case); other files are left out.
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg")
#: Pillow's mode for each channel count.
MODES = {1: "L", 2: "LA", 3: "RGB", 4: "RGBA"}


def is_image_file(path: Path) -> bool:
    """Whether ``path`` names a PNG or JPEG image by its suffix (:data:`IMAGE_SUFFIXES`)."""
    return Path(path).suffix.lower() in IMAGE_SUFFIXES


def _native_mode(image: Image.Image) -> str:
    """The :data:`MODES` mode that keeps what ``image`` holds: a palette as RGB (with alpha when it
    has transparency), 16- and 32-bit gray as 8-bit gray, CMYK and YCbCr as RGB, bilevel as gray."""
    if image.mode in MODES.values():
        return image.mode
    if image.mode == "P":
        return "RGBA" if "transparency" in image.info else "RGB"
    if image.mode in ("PA",):
        return "RGBA"
    if image.mode in ("1", "I", "I;16", "I;16B", "I;16L", "F"):
        return "L"
    return "RGB"


def _to_8_bits(image: Image.Image) -> Image.Image:
    """16- and 32-bit gray levels scaled to 0..255 (Pillow's own ``convert("L")`` clips them instead)."""
    if image.mode not in ("I", "I;16", "I;16B", "I;16L", "F"):
        return image
    values = np.asarray(image, dtype=np.float64)
    top = 65535.0 if image.mode.startswith("I;16") or values.max() > 255 else 255.0
    return Image.fromarray(np.clip(np.rint(values / top * 255), 0, 255).astype(np.uint8), mode="L")


def decode_image_file(path: Path, channels: int | None = None) -> Tensor:
    """Read one PNG or JPEG file.

    Args:
        path: the file.
        channels: the channel count wanted (1, 2, 3 or 4), converting as Pillow does (RGB to gray
            by ITU-R 601-2 luma); None (default): the image's own (:func:`_native_mode`).

    Returns:
        Its pixels, ``(C, H, W)`` uint8.

    Raises:
        DataNotAvailableError: when the file cannot be read (permissions, a folder).
        DataFormatError: naming the file, when it is not an image Pillow can decode, or is truncated.
    """
    try:
        with Image.open(path) as image:
            image.load()
            image = _to_8_bits(image)
            image = image.convert(MODES[channels] if channels else _native_mode(image))
    except (FileNotFoundError, PermissionError, IsADirectoryError) as error:
        fix = (
            "Make it readable for this user (chmod a+r), or remove it."
            if isinstance(error, PermissionError)
            else "Replace it with a PNG or JPEG image file, or remove it."
        )
        raise DataNotAvailableError(f"{path} cannot be read ({error.strerror or error}). {fix}") from None
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError) as error:
        # Pillow says "image file is truncated" or "cannot identify image file '<path>'".
        reason = first_line(error).replace(f" '{path}'", "")
        raise DataFormatError(
            f"{path} cannot be decoded as an image ({reason}). Replace it with a PNG or JPEG image, or remove it."
        ) from None
    return _pixels(image)


def _pixels(image: Image.Image) -> Tensor:
    """A Pillow image of a :data:`MODES` mode as ``(C, H, W)`` uint8."""
    pixels = torch.from_numpy(np.array(image, dtype=np.uint8))
    return pixels.unsqueeze(0) if pixels.ndim == 2 else pixels.permute(2, 0, 1).contiguous()


def converted(pixels: Tensor, channels: int) -> Tensor:
    """``(c, H, W)`` uint8 -> ``(channels, H, W)`` uint8 by Pillow's conversion, as :func:`decode_image_file`
    converts a file (RGB to gray by ITU-R 601-2 luma, gray to RGB by copying, alpha added opaque or dropped)."""
    if pixels.shape[0] == channels:
        return pixels
    array = pixels.permute(1, 2, 0).numpy()
    image = Image.fromarray(array[..., 0] if pixels.shape[0] == 1 else array, MODES[pixels.shape[0]])
    return _pixels(image.convert(MODES[channels]))


def resized(pixels: Tensor, size: tuple[int, int]) -> Tensor:
    """``(C, h, w)`` uint8 -> ``(C, H, W)`` uint8 for ``size = (H, W)``, bilinear with antialiasing
    (torchvision's ``resize``); the same pixels when they already are that size."""
    if tuple(pixels.shape[1:]) == tuple(size):
        return pixels
    return resize(pixels, list(size), antialias=True)
