"""Train-time augmentation whose random draw for a sample depends only on the seed, the epoch and the
sample's index: random crop with zero padding and horizontal flip, applied to a whole batch at once.

torchvision's ``RandomCrop(padding=p)`` and ``RandomHorizontalFlip`` draw from the random state of
the process that runs them: a DataLoader worker's (seeded per worker and per epoch), or the main
process's. Which batches a worker serves depends on ``num_workers``, and a resume restarts the
workers, so the draws of a sample change with the number of workers and after a resume: an
interrupted run would not continue as the uninterrupted one did. Here each sample's offsets and
flip are a hash of ``(seed, epoch, index)`` (:func:`sample_draws`), so a resume in place, on
another world size or with another ``num_workers`` sees the same augmented batches. The hash is
computed on the batch's device, so a batch on a GPU is augmented there without a host round trip.
"""

import torch
from torch import Tensor

#: The modulus of the hash's arithmetic: the prime 2**31 - 1, so that every product of two
#: residues fits in int64 without overflow.
_PRIME = 2_147_483_647
#: Multipliers and increments of its rounds (odd constants below the modulus, chosen arbitrarily).
_ROUNDS = ((1_103_515_245, 12_345), (69_069, 1), (1_664_525, 1_013_904_223), (22_695_477, 1))


def sample_draws(seed: int, epoch: int, indices: Tensor, stream: int) -> Tensor:
    """One pseudo-random integer in ``[0, 2**31 - 1)`` per sample, a function of ``(seed, epoch,
    index, stream)`` only.

    Args:
        seed: the run's seed (``data.shuffle_seed``).
        epoch: the training epoch.
        indices: ``(B,)`` int64 sample indices in the training split.
        stream: which draw of the sample (0: the flip, 1: the vertical, 2: the horizontal offset).

    Returns:
        ``(B,)`` int64, on the device of ``indices``.
    """
    x = indices.to(torch.int64) % _PRIME
    for value in (seed, epoch, stream):
        x = (x * 48_271 + value % _PRIME) % _PRIME
        # Squaring is the non-linear step: linear rounds alone would keep neighbouring indices' draws correlated.
        for multiplier, increment in _ROUNDS:
            x = (x * x % _PRIME * multiplier + increment) % _PRIME
    return x


def crop_and_flip(
    images: Tensor, indices: Tensor, seed: int, epoch: int, padding: int, horizontal_flip: bool
) -> Tensor:
    """Random crop with zero padding and random horizontal flip of each image, drawn by :func:`sample_draws`.

    Each image is padded with ``padding`` zero pixels on every side and cut back to its size at
    an offset drawn uniformly from ``0..2 * padding`` in each direction (torchvision's
    ``RandomCrop(size, padding=padding)``), then mirrored left-right with probability 1/2
    (``RandomHorizontalFlip``).

    Args:
        images: ``(B, C, H, W)`` uint8 pixels (zero padding is black, as torchvision pads raw images).
        indices: ``(B,)`` int64 their indices in the training split.
        seed, epoch: as for :func:`sample_draws`.
        padding: pixels of padding (0: no crop).
        horizontal_flip: whether to flip.

    Returns:
        ``(B, C, H, W)`` uint8, a new tensor (the input is left as it is).
    """
    batch, _, height, width = images.shape
    if padding > 0:
        span = 2 * padding + 1
        top = sample_draws(seed, epoch, indices, 1) % span
        left = sample_draws(seed, epoch, indices, 2) % span
        padded = torch.nn.functional.pad(images, (padding, padding, padding, padding))
        rows = (top.view(batch, 1) + torch.arange(height, device=images.device)).view(batch, 1, height, 1)
        columns = (left.view(batch, 1) + torch.arange(width, device=images.device)).view(batch, 1, 1, width)
        # One gather for the batch: row r, column c of image b comes from padded[b, :, top_b + r, left_b + c].
        images = padded.gather(2, rows.expand(-1, padded.shape[1], -1, padded.shape[3]))
        images = images.gather(3, columns.expand(-1, images.shape[1], height, -1))
    if horizontal_flip:
        flip = (sample_draws(seed, epoch, indices, 0) % 2 == 1).view(batch, 1, 1, 1)
        images = torch.where(flip, images.flip(3), images)
    return images
