"""Each epoch's training shards, and the position inside an epoch that a checkpoint saves.

The training sampler is torch's ``DistributedSampler`` (shuffled, ``drop_last=True``): every epoch
one permutation of the train split, the same on every rank, of which rank ``r`` of ``W`` takes
positions ``r, r + W, r + 2W, ...``. With a per-device batch of ``b = G / W`` (``G`` the global
batch, no accumulation), the ``k``-th global batch is therefore positions ``[k G, (k + 1) G)`` of
the permutation, whatever ``W`` is (with ``a`` accumulated micro-batches, the ``k``-th optimizer
step is positions ``[k G, (k + 1) G)`` too). A position in an epoch is then one integer, the
global samples already trained, and it means the same on any world size with the same global
batch: a run resumes there with another number of processes. (The epoch's last batch is the
exception when the global batch does not divide the shards: each rank's last micro-batch is what
its shard has left, so the last step, and the steps per epoch, can differ between world sizes: with
1,202 samples and a global batch of 12, 2 processes take 101 steps and 3 take 100.)

Lightning saves and restores a training dataloader's position when the loader has
``state_dict`` / ``load_state_dict`` (its "stateful dataloader" protocol, which it otherwise
serves with torchdata's ``StatefulDataLoader``): :class:`ResumableDataLoader` is that loader.
Without it Lightning restarts an interrupted epoch from its first batch, training some samples
twice and never reaching others.

Lightning creates the training loader's iterator once before it sets the sampler's epoch
(``FitLoop.setup_data``, then ``on_advance_start``), and a resumed run trains its first epoch from
that iterator. torch's iterator with worker processes sends the workers their first batches'
indices as it is created, so those indices would be drawn from the checkpoint's epoch and position,
not from the epoch the resumed run trains next: :class:`ResumableDataLoader` creates the real
iterator at the first batch (:class:`_DeferredIterator`), after the epoch is set, as torch's
in-process iterator reads its sampler at the first batch anyway.

Evaluation and prediction shard without padding (:class:`UnpaddedDistributedSampler`): torch's
``DistributedSampler`` repeats samples to give every rank as many, which would count them twice.
"""

from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader, DistributedSampler

from ddp_engine.core.errors import ConfigValueError


class ResumableDistributedSampler(DistributedSampler):
    """``DistributedSampler`` (shuffled, ``drop_last=True``) whose epoch can start at a global
    sample position (:attr:`start`), for a resume inside an epoch.

    ``__len__`` stays the whole epoch's shard, so that Lightning counts the epoch's batches as
    usual and its restored batch counter ends the epoch where the uninterrupted run would have.

    Args:
        dataset, num_replicas, rank, seed: as for ``DistributedSampler``.

    Attributes:
        start: global samples of epoch :attr:`epoch` trained before this run; the epoch's shard
            starts after them. Reset to 0 when :meth:`set_epoch` moves to another epoch.
    """

    def __init__(self, dataset: Any, num_replicas: int, rank: int, seed: int = 0) -> None:
        super().__init__(dataset, num_replicas=num_replicas, rank=rank, shuffle=True, seed=seed, drop_last=True)
        self.start = 0

    def global_order(self) -> list[int]:
        """This epoch's permutation of the dataset, cut to ``total_size`` (``DistributedSampler``'s)."""
        generator = torch.Generator()
        generator.manual_seed(self.seed + self.epoch)
        return torch.randperm(len(self.dataset), generator=generator).tolist()[: self.total_size]

    def __iter__(self) -> Iterator[int]:
        # Positions [start, total_size) of the permutation, dealt out to the ranks as
        # DistributedSampler deals positions [0, total_size) (its indices[rank:total:replicas]).
        return iter(self.global_order()[self.start :][self.rank :: self.num_replicas])

    def set_epoch(self, epoch: int) -> None:
        if epoch != self.epoch:
            self.start = 0
        super().set_epoch(epoch)


class UnpaddedDistributedSampler(DistributedSampler):
    """Evaluation's and prediction's sharding: every sample of ``dataset`` to exactly one of
    ``num_replicas`` ranks, in order, none repeated: rank ``r`` takes samples ``r``,
    ``r + num_replicas``, ``r + 2 num_replicas``, ... of the ``N = len(dataset)``.

    torch's ``DistributedSampler`` pads the shards to equal size with repeated samples, which would
    count those twice in synced metrics (and predict them twice); here the shards' sizes differ by
    one at most instead: rank ``r`` has ``ceil((N - r) / num_replicas)`` samples (:attr:`num_samples`).
    Ranks that run different batch counts are safe where no collective runs per batch (evaluation
    and prediction sync at the end of the epoch), not in training. The shards are those of
    Lightning's ``UnrepeatedDistributedSampler`` (``shuffle=False``), the sampler ``trainer.predict``
    puts in by itself. It is a ``DistributedSampler`` (``set_epoch``, :attr:`num_replicas`,
    :attr:`rank`), so Lightning keeps it even with ``use_distributed_sampler=True`` (the engine's
    trainer config sets False).

    Args:
        dataset: a map-style dataset of ``N`` samples (``len()``).
        num_replicas: the ranks sharing it (the world size).
        rank: this rank, ``0 <= rank < num_replicas``.

    Raises:
        ConfigValueError: when ``0 < N < num_replicas``: a rank would have no sample, and would run
            no batch of the epoch while the others run some, whose syncs at the epoch's end (the
            metrics, values logged with ``sync_dist``) could then wait for it. An empty dataset gives
            every rank nothing alike, and is allowed.
        ValueError: from ``DistributedSampler``, for a ``rank`` outside ``[0, num_replicas)``.
    """

    def __init__(self, dataset: Any, num_replicas: int, rank: int) -> None:
        super().__init__(dataset, num_replicas=num_replicas, rank=rank, shuffle=False, drop_last=False)
        size = len(dataset)
        if 0 < size < num_replicas:
            raise ConfigValueError(
                f"{size} sample{'s' * (size != 1)} cannot be shared by {num_replicas} processes so that each "
                f"evaluates or predicts at least one: run on at most {size} process{'es' * (size != 1)} "
                "(trainer.devices x trainer.num_nodes), or with more samples."
            )
        self.total_size = size  # no padding: DistributedSampler's total is a multiple of num_replicas
        self.num_samples = len(range(rank, size, num_replicas))

    def __iter__(self) -> Iterator[int]:
        return iter(range(self.rank, self.total_size, self.num_replicas))


class ResumableDataLoader(DataLoader):
    """A training ``DataLoader`` whose position in the epoch goes into Lightning's checkpoints.

    Args:
        *args, **kwargs: as for ``DataLoader``; ``sampler`` must be a :class:`ResumableDistributedSampler`.
        trained_batches: returns how many batches of the current epoch this rank has trained
            (every rank trains as many); read when a checkpoint is saved.
        global_batch_size: samples per optimizer step over all processes (``data.global_batch_size``).

    The state is ``{"epoch", "samples", "global_batch_size"}``: the epoch, the global samples of it
    already trained, and the global batch they were trained in; empty when Lightning replaced the
    sampler (``trainer.overfit_batches``), which has no position to resume.

    Raises:
        ConfigValueError: from :meth:`load_state_dict`, when the checkpoint's global batch is not
            this run's (its steps would be other sets of samples).
    """

    def __init__(self, *args: Any, trained_batches: Callable[[], int], global_batch_size: int, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.trained_batches = trained_batches
        self.global_batch_size = global_batch_size

    def __iter__(self) -> Iterator[Any]:
        return _DeferredIterator(super().__iter__)

    def state_dict(self) -> dict[str, int]:
        sampler = self.sampler
        if not isinstance(sampler, ResumableDistributedSampler):
            return {}
        # The epoch's batches since its start, those before a resume included (Lightning restores
        # its counter), in micro-batches of batch_size on each of num_replicas ranks.
        samples = self.trained_batches() * self.batch_size * sampler.num_replicas
        return {"epoch": sampler.epoch, "samples": samples, "global_batch_size": self.global_batch_size}

    def load_state_dict(self, state: dict[str, int]) -> None:
        if not state or not isinstance(self.sampler, ResumableDistributedSampler):
            return
        if state["global_batch_size"] != self.global_batch_size:
            raise ConfigValueError(
                f"ckpt_path: the checkpoint was trained with data.global_batch_size={state['global_batch_size']}, "
                f"this run has {self.global_batch_size}: resume with data.global_batch_size="
                f"{state['global_batch_size']} (any trainer.devices that divides it)."
            )
        sampler: ResumableDistributedSampler = self.sampler
        sampler.set_epoch(state["epoch"])
        sampler.start = state["samples"]


class _DeferredIterator:
    """An iterator that calls ``start()`` for the real one at its first ``next()`` (see the module's docstring)."""

    def __init__(self, start: Callable[[], Iterator[Any]]) -> None:
        self._start, self._iterator = start, None

    def __iter__(self) -> "_DeferredIterator":
        return self

    def __next__(self) -> Any:
        if self._iterator is None:
            self._iterator = self._start()
        return next(self._iterator)
