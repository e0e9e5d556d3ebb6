"""The base of the image classification DataModules (:class:`ClassificationDataModule`): a subclass
provides the data set's facts and its split datasets of uint8 images and integer labels; on top of
the engine's sharding, exact evaluation and resume position (:class:`~ddp_engine.data.sharded.ShardedDataModule`)
come normalization and augmentation.

Every batch arrives as uint8 pixels and is normalized on its device by the data set's own formula
(:meth:`ddp_engine.vision.spec.DataSpec.normalize`), after the optional train-time augmentation
(:mod:`ddp_engine.vision.augment`).
"""

from functools import cached_property
from pathlib import Path
from typing import Any

from torch import Tensor
from torch.utils.data import DataLoader, Dataset
from typing_extensions import override

from ddp_engine.api import ConfigValueError, ShardedDataModule, collate_for
from ddp_engine.vision.augment import crop_and_flip
from ddp_engine.vision.spec import DataSpec, check_same_data, read_data_spec


def first_pixels(dataset: Dataset, count: int) -> Tensor:
    """The first ``count`` images of ``dataset`` (fewer if it is smaller), ``(count, C, H, W)`` uint8
    as stored (not normalized): for checks of a model that takes raw pixels (``export``)."""
    loader = DataLoader(dataset, batch_size=min(count, len(dataset)), collate_fn=collate_for(dataset))
    return next(iter(loader))[0].cpu().clone()


class ClassificationDataModule(ShardedDataModule):
    """The base of the template's image classification DataModules: a subclass provides the data
    set's facts and its split datasets; sharding, the batch layout, exact evaluation and the resume
    position come from :class:`~ddp_engine.data.sharded.ShardedDataModule`, normalization and
    augmentation from here.

    A subclass implements:

    - :meth:`describe` -> :class:`~ddp_engine.vision.spec.DataSpec`: class names, image shape
      ``(C, H, W)``, per-channel mean and std. Called once per process (then :attr:`spec`
      keeps it), also before any process starts, so it may read files but should be quick.
    - ``setup(stage)``: set :attr:`train_set` and :attr:`val_set` for ``"fit"`` and
      ``"validate"``, :attr:`test_set` for ``"test"``. Each is a map-style dataset whose sample
      ``i`` is ``(pixels, label)``: ``(C, H, W)`` uint8 and an int in ``0..num_classes - 1``
      (torch's ``default_collate`` stacks them), or a :class:`~ddp_engine.data.sharded.GatherDataset`
      of ``(N, C, H, W)`` uint8 and ``(N,)`` int64 tensors, which serves whole batches.
    - optionally ``prepare_data()`` and :meth:`check_splits`
      (:class:`~ddp_engine.data.sharded.ShardedDataModule` says when they run).

    The network is built for :attr:`spec` (:meth:`model_arguments`), and a checkpoint is applied
    only to the data it was trained for (:meth:`check_checkpoint`).

    Args:
        global_batch_size, num_workers, shuffle_seed, prepare_data_per_node, on_device: see
            :class:`~ddp_engine.data.sharded.ShardedDataModule`; ``shuffle_seed`` also seeds the
            augmentation's draws.
        crop_padding: train-time random crop: pixels of zero padding on each side, then a crop
            back to the image size at a random offset (default 0: off). For natural images, about
            an eighth of the image size (4 for 32x32); off for digits, whose position matters.
        horizontal_flip: train-time random left-right flip with probability 1/2 (default False;
            off for digits and text, which a mirror changes).

    The augmentation draws of a sample depend only on ``shuffle_seed``, the epoch and the
    sample's index (:mod:`ddp_engine.vision.augment`), so a resume in place, on another world size
    or with another ``num_workers`` sees the same augmented batches as the uninterrupted run.

    Raises:
        ConfigValueError: from the constructor for a negative ``crop_padding`` or ``num_workers``.
    """

    def __init__(
        self,
        global_batch_size: int,
        num_workers: int = 0,
        shuffle_seed: int = 0,
        crop_padding: int = 0,
        horizontal_flip: bool = False,
        prepare_data_per_node: bool = True,
        on_device: bool = False,
    ) -> None:
        super().__init__(global_batch_size, num_workers, shuffle_seed, prepare_data_per_node, on_device)
        if crop_padding < 0:
            raise ConfigValueError(f"data.crop_padding={crop_padding} must be 0 (no crop) or more pixels.")
        self.crop_padding = crop_padding
        self.horizontal_flip = horizontal_flip

    def describe(self) -> DataSpec:
        """The data set's facts: class names, image shape, normalization (see the class's docstring).

        Raises:
            NotImplementedError: in a subclass that does not define it.
        """
        raise NotImplementedError(f"{type(self).__name__} must define describe() -> DataSpec")

    @cached_property
    def spec(self) -> DataSpec:
        """:meth:`describe`'s result, computed once."""
        return self.describe()

    @property
    def class_names(self) -> list[str]:
        """One name per class, label ``i`` is ``class_names[i]`` (:attr:`spec`)."""
        return list(self.spec.class_names)

    @property
    def augments(self) -> bool:
        """Whether training batches are augmented (``crop_padding`` or ``horizontal_flip``)."""
        return self.crop_padding > 0 or self.horizontal_flip

    @property
    @override
    def serves_indices(self) -> bool:
        # The augmentation's draws need each sample's index (ddp_engine.vision.augment).
        return self.augments

    @override
    def model_arguments(self) -> dict[str, Any]:
        """``net``: the data's ``in_channels``, ``image_size`` and ``num_classes``; ``data_spec``: the
        spec, which the classifier keeps in every checkpoint
        (:meth:`~ddp_engine.vision.spec.DataSpec.model_arguments`)."""
        return self.spec.model_arguments()

    @override
    def model_arguments_of(self, checkpoint: Path) -> dict[str, Any] | None:
        """Those of the spec ``checkpoint`` keeps (:func:`~ddp_engine.vision.spec.read_data_spec`); None
        when it keeps none (its module stores no spec) or cannot be read (its own check says why)."""
        try:
            spec = read_data_spec(checkpoint)
        except Exception:  # noqa: BLE001 - any unreadable file: the checkpoint's own check says why, in one line
            return None
        return spec.model_arguments() if spec is not None else None

    @override
    def check_checkpoint(self, checkpoint: Path) -> None:
        """Refuse a checkpoint whose data spec (:func:`~ddp_engine.vision.spec.read_data_spec`) differs
        from :attr:`spec` (:func:`~ddp_engine.vision.spec.check_same_data`); one that keeps none, or
        cannot be read, is not checked here."""
        try:
            saved = read_data_spec(checkpoint)
        except Exception:  # noqa: BLE001 - any unreadable file: the checkpoint's own check says why, in one line
            return
        check_same_data(self.spec, saved, checkpoint, f"{type(self).__module__}.{type(self).__name__}")

    @override
    def summary(self) -> str:
        spec = self.spec
        channels, height, width = spec.input_shape
        labels = ", ".join(f"{index}={name}" for index, name in enumerate(spec.class_names))
        return (
            f"{spec.num_classes} classes ({labels}), images {channels}x{height}x{width}, per-channel mean "
            f"{[round(v, 4) for v in spec.mean]} and std {[round(v, 4) for v in spec.std]} (on a 0..1 scale)"
        )

    @override
    def on_after_batch_transfer(self, batch: Any, dataloader_idx: int) -> tuple[Tensor, Tensor]:
        """``(pixels (B, C, H, W) uint8, labels (B,))``, with the samples' indices ``(B,)`` as a third
        element in augmented training -> ``(images (B, C, H, W) float32, normalized, labels)``."""
        pixels, labels, *indices = batch
        if indices and self.trainer is not None and self.trainer.training:
            pixels = crop_and_flip(
                pixels, indices[0], self.shuffle_seed, self.trainer.current_epoch, self.crop_padding,
                self.horizontal_flip,
            )  # fmt: skip
        return self.spec.normalize(pixels), labels
