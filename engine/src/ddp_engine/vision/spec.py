"""What a data set tells the rest of the template about itself: its classes, the shape of its
images and their normalization (:class:`DataSpec`).

The DataModule owns these facts (``datamodule.spec``); the network is built for them
(:func:`ddp_engine.models.build.build_model`), the classifier keeps them in every checkpoint, and
the metrics, figures, ``predict`` and ``export`` read them from there: no second copy anywhere.
"""

import functools
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from ddp_engine.api import ConfigValueError

#: The key under which a checkpoint holds its data set's spec (:meth:`DataSpec.to_dict`).
CHECKPOINT_KEY = "data_spec"


@dataclass(frozen=True)
class DataSpec:
    """The facts of an image classification data set that everything besides its loading depends on.

    Attributes:
        class_names: one name per class; label ``i`` is ``class_names[i]``, the networks output
            ``len(class_names)`` logits.
        input_shape: ``(C, H, W)`` of every image as the network takes it: channels, height and
            width in pixels.
        mean: per channel, the mean of the training pixels on a 0..1 scale (``C`` values).
        std: per channel, their standard deviation (``C`` positive values). Pixels are served as
            ``(pixel / 255 - mean[c]) / std[c]`` (:meth:`normalize`).

    Raises:
        ConfigValueError: from the constructor, for no class, a shape that is not three positive
            sizes, or a ``mean`` / ``std`` without one value per channel or with a ``std`` that is
            not positive.
    """

    class_names: tuple[str, ...]
    input_shape: tuple[int, int, int]
    mean: tuple[float, ...]
    std: tuple[float, ...]

    def __post_init__(self) -> None:
        # Plain tuples of plain values: a checkpoint keeps them, and loads with weights_only=True.
        object.__setattr__(self, "class_names", tuple(str(name) for name in self.class_names))
        object.__setattr__(self, "input_shape", tuple(int(size) for size in self.input_shape))
        object.__setattr__(self, "mean", tuple(float(value) for value in per_channel(self.mean, self.channels)))
        object.__setattr__(self, "std", tuple(float(value) for value in per_channel(self.std, self.channels)))
        if not self.class_names:
            raise ConfigValueError("The data set has no class (class_names is empty).")
        if len(self.input_shape) != 3 or min(self.input_shape) < 1:
            raise ConfigValueError(f"The data set's image shape {self.input_shape} is not (channels, height, width).")
        if len(self.mean) != self.channels or len(self.std) != self.channels:
            raise ConfigValueError(
                f"data.mean and data.std need one value per channel ({self.channels}); got {len(self.mean)} and "
                f"{len(self.std)}."
            )
        if not all(value > 0 for value in self.std):
            raise ConfigValueError(f"data.std={list(self.std)} must be positive (the training pixels' std).")

    @property
    def num_classes(self) -> int:
        """How many classes: the networks' output size."""
        return len(self.class_names)

    @property
    def channels(self) -> int:
        """``C`` of :attr:`input_shape`."""
        return self.input_shape[0]

    @property
    def image_size(self) -> tuple[int, int]:
        """``(H, W)`` of :attr:`input_shape`, in pixels."""
        return self.input_shape[1], self.input_shape[2]

    def network_arguments(self) -> dict[str, Any]:
        """The arguments every network takes from the data: ``in_channels``, ``image_size`` ``[H, W]``
        and ``num_classes`` (:mod:`ddp_engine.vision.networks`)."""
        return {"in_channels": self.channels, "image_size": list(self.image_size), "num_classes": self.num_classes}

    def model_arguments(self) -> dict[str, Any]:
        """What the classifier is built for (:func:`ddp_engine.models.build.build_model`): ``net``, the
        :meth:`network_arguments`; ``data_spec``, this spec, which it keeps in every checkpoint."""
        return {"net": self.network_arguments(), "data_spec": self.to_dict()}

    def normalize(self, pixels: Tensor) -> Tensor:
        """``(N, C, H, W)`` uint8 pixels -> ``(N, C, H, W)`` float32 (:func:`normalize_pixels`), on the
        pixels' own device: training batches and ``predict``'s inputs go through it."""
        return normalize_pixels(pixels, *self.statistics(pixels.device))

    def denormalize(self, images: Tensor) -> Tensor:
        """``(N, C, H, W)`` float32 images as :meth:`normalize` serves them -> the pixels on a 0..1 scale, clamped."""
        mean, std = self.statistics(images.device)
        return (images.float() * std + mean).clamp(0, 1)

    def statistics(self, device: torch.device | str = "cpu") -> tuple[Tensor, Tensor]:
        """:attr:`mean` and :attr:`std` as ``(C, 1, 1)`` float32 tensors on ``device``, made once per
        device (a copy to a GPU at every batch would wait for the GPU)."""
        return _tensor(self.mean, torch.device(device)), _tensor(self.std, torch.device(device))

    def to_dict(self) -> dict[str, list]:
        """Plain lists (for a checkpoint, ``torch.load(weights_only=True)``, and for JSON)."""
        return {key: list(value) for key, value in asdict(self).items()}

    @classmethod
    def from_dict(cls, values: Mapping[str, Sequence]) -> "DataSpec":
        """The inverse of :meth:`to_dict` (also takes a config node with these four keys)."""
        return cls(**{key: tuple(values[key]) for key in ("class_names", "input_shape", "mean", "std")})

    def differences(self, other: "DataSpec") -> list[str]:
        """What differs from ``other``, one ``key: ours vs theirs`` text each (floats to 1e-6); empty when alike."""
        found = [
            f"{key}: {list(getattr(self, key))} vs {list(getattr(other, key))}"
            for key in ("class_names", "input_shape")
            if getattr(self, key) != getattr(other, key)
        ]
        for key in ("mean", "std"):
            ours, theirs = getattr(self, key), getattr(other, key)
            if len(ours) != len(theirs) or any(abs(a - b) > 1e-6 for a, b in zip(ours, theirs)):
                found.append(f"{key}: {[round(v, 6) for v in ours]} vs {[round(v, 6) for v in theirs]}")
        return found


def normalize_pixels(pixels: Tensor, mean: Tensor, std: Tensor) -> Tensor:
    """``(N, C, H, W)`` uint8 pixels -> ``(N, C, H, W)`` float32, ``(pixel / 255 - mean[c]) / std[c]``
    with ``mean``, ``std`` of shape ``(C, 1, 1)`` (:meth:`DataSpec.statistics`): the one formula of
    the template, for training batches, ``predict``'s inputs and the graph that ``export`` writes."""
    return (pixels.float() / 255.0 - mean) / std


@functools.lru_cache(maxsize=64)
def _tensor(values: tuple[float, ...], device: torch.device) -> Tensor:
    return torch.tensor(values, dtype=torch.float32, device=device).view(-1, 1, 1)


def per_channel(values: float | Sequence[float], channels: int) -> tuple[float, ...]:
    """A statistic given once for all channels (``0.5``) or per channel (``[0.49, 0.48, 0.45]``), as
    ``channels`` values."""
    if isinstance(values, int | float):
        return (float(values),) * channels
    values = tuple(values)
    return values * channels if len(values) == 1 else values


def read_data_spec(checkpoint: Path) -> DataSpec | None:
    """The data spec a checkpoint keeps (:data:`CHECKPOINT_KEY`, written by the classifier), or None
    for a checkpoint that keeps none (a module that stores no spec: its run's config describes its
    data). Loaded with ``weights_only=True``."""
    saved = torch.load(checkpoint, map_location="cpu", weights_only=True).get(CHECKPOINT_KEY)
    return DataSpec.from_dict(saved) if saved is not None else None


def checkpoint_data_spec(checkpoint: Path, data: Any) -> DataSpec:
    """The data set ``checkpoint`` was trained for: the spec it keeps, or, for a checkpoint that keeps
    none, the spec of ``data`` (the ``data`` config node of its run), whose DataModule is built but
    whose files are not read for it."""
    from hydra.utils import instantiate

    return read_data_spec(checkpoint) or instantiate(data).spec


def check_same_data(spec: DataSpec, saved: DataSpec | None, checkpoint: Path, data_target: str) -> None:
    """Refuse to apply a checkpoint to data other than what it was trained for: ``spec`` (the data
    set's own, ``datamodule.spec``) must equal ``saved`` (the checkpoint's; None: not known, nothing
    checked), classes, image shape and normalization alike.

    Raises:
        ConfigValueError: naming the checkpoint, the data set and what differs.
    """
    if saved is not None and (differences := spec.differences(saved)):
        raise ConfigValueError(
            f"ckpt_path={checkpoint} was trained on other data than {data_target} describes now (data set vs "
            f"checkpoint: {'; '.join(differences)}). Use the data set the model was trained on (its files changed, "
            "or data points elsewhere), or train a new model on this one."
        )
