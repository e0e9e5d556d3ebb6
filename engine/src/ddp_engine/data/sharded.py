"""The base of every DataModule the engine trains (:class:`ShardedDataModule`), whatever its samples:
images, sequences, tables. A subclass provides its split datasets; the sharding, the batch layout,
exact evaluation and the resume position inside an epoch come with it.

- Training: a ``DistributedSampler`` (:class:`~ddp_engine.data.sharding.ResumableDistributedSampler`)
  gives each process a disjoint shard of the train split, reshuffled every epoch and reproducible
  for a seed; the loader's position inside the epoch goes into checkpoints
  (:class:`~ddp_engine.data.sharding.ResumableDataLoader`), so a resume continues at the next
  global batch on any world size with the same global batch.
- Validation and test: an unpadded sampler gives each sample to exactly one process
  (:func:`unrepeated_loader`, :class:`~ddp_engine.data.sharding.UnpaddedDistributedSampler`), so
  metrics synced over all processes do not depend on the number of processes.
"""

from pathlib import Path
from typing import Any, ClassVar

import lightning as L
import torch
from torch import Tensor
from torch.utils.data import DataLoader, Dataset
from typing_extensions import override

from ddp_engine.core.compat import epoch_batches_processed
from ddp_engine.core.errors import ConfigValueError
from ddp_engine.data.gather import GatherDataset, WithIndices, collate_for
from ddp_engine.data.loader_workers import seeded_by_torch, workers_context
from ddp_engine.data.sharding import ResumableDataLoader, ResumableDistributedSampler, UnpaddedDistributedSampler
from ddp_engine.distributed.layout_rules import per_device_batch_size, per_device_eval_batch_size

#: Loader seeds of two processes differ for any world size below this: ``shuffle_seed * stride + global_rank``.
WORKER_SEED_STRIDE = 1 << 20


def unrepeated_loader(dataset: Dataset, world_size: int, global_rank: int, **options) -> DataLoader:
    """A DataLoader of this replica's shard of ``dataset`` for evaluation or prediction: every sample
    goes to exactly one of the ``world_size`` replicas, in order (replica ``r`` takes samples ``r``,
    ``r + world_size``, ...), and none is repeated; ``options`` are the DataLoader's others
    (``collate_fn`` defaults to :func:`collate_for`, and with ``num_workers`` > 0
    ``multiprocessing_context`` to :func:`~ddp_engine.data.loader_workers.workers_context`'s: the
    workers are not forked from this process).

    torch's DistributedSampler pads the last shard with repeated samples, which would count them
    twice in val/test metrics (and predict them twice). The unpadded sampler
    (:class:`~ddp_engine.data.sharding.UnpaddedDistributedSampler`, the sharding ``trainer.predict``
    puts in by itself) lets shard sizes differ by one instead; this is safe because evaluation and
    prediction run no collective per batch, only at the end of the epoch.

    Raises:
        ConfigValueError: for a non-empty ``dataset`` smaller than ``world_size``: each replica
            needs a sample.
    """
    sampler = UnpaddedDistributedSampler(dataset, num_replicas=world_size, rank=global_rank)
    defaults = {"collate_fn": collate_for(dataset)}
    if options.get("num_workers", 0) > 0 and "multiprocessing_context" not in options:
        defaults["multiprocessing_context"] = workers_context(type(dataset).__module__)
    return DataLoader(dataset, sampler=sampler, **{**defaults, **options})


class ShardedDataModule(L.LightningDataModule):
    """The base of the DataModules the engine trains: a subclass provides its split datasets;
    sharding, the batch layout, exact evaluation and the resume position come with it.

    A subclass implements:

    - ``setup(stage)``: set :attr:`train_set` and :attr:`val_set` for ``"fit"`` and
      ``"validate"``, :attr:`test_set` for ``"test"``. Each is a map-style dataset whose sample is
      a tuple of tensors or numbers (``(inputs, target)``: torch's ``default_collate`` stacks
      them), or a :class:`GatherDataset` of ``(N, ...)`` tensors, which serves whole batches.
      A batch's sample count is the length of its first element (the throughput figures).
    - optionally ``prepare_data()``: fetch and check the files, once per node (or once per job:
      ``prepare_data_per_node``), before any process trains; the training command calls it
      before it starts the processes, so that a bad data set is one line, not an error per rank.
    - optionally ``on_after_batch_transfer``: Lightning's hook, to transform a batch on its device
      (normalize, augment); with :attr:`serves_indices` training batches carry the samples'
      indices ``(B,)`` int64 as their last element, for draws that a resume must repeat.

    and may override what the engine asks of the data, before any process starts:

    - :meth:`model_arguments`: what the task's LightningModule is built for (its input shape, its
      classes), passed to the ``model`` config's instantiation (default: nothing); and
      :meth:`model_arguments_of` a checkpoint, for a prediction, which reads no data set files;
    - :meth:`check_splits`: refuse splits that leave no training (or validation) sample;
    - :meth:`check_checkpoint`: refuse a checkpoint trained on other data (eval, predict, export);
    - :meth:`summary`: one line about the data for the job's log.

    ``ddp_engine.data.conformance`` checks on 2 and 3 processes that a subclass keeps the
    guarantees (every training sample once per epoch, evaluation exact, the resume position exact).

    Args:
        global_batch_size: samples per optimizer step summed over all processes; each process
            loads ``global_batch_size / (world_size * accumulate_grad_batches)`` per step.
        num_workers: DataLoader worker processes per DDP process (default 0), started from a
            forkserver of the process, not forked from it (:mod:`ddp_engine.data.loader_workers`).
        shuffle_seed: seed of the training sampler's per-epoch permutation (default 0; the
            configs give ``${seed}``).
        prepare_data_per_node: True (default): ``prepare_data`` runs on local rank 0 of every
            node, for data on node-local disks. False: on global rank 0 only, for data on a
            filesystem all nodes share.
        on_device: False (default): the splits stay in host memory and Lightning copies each
            batch to the device. True: a :class:`GatherDataset` split is moved to the process's
            device once, and each batch is an index gather there, with no host-to-device copy per
            step. For GPUs; on CPU it changes nothing.

    Raises:
        ConfigValueError: from the constructor for a negative ``num_workers``; from the loaders
            when ``on_device`` is combined with ``num_workers`` > 0 (worker processes cannot serve
            tensors that live on a GPU).
        BatchSizeError: from the dataloaders, for a global batch that does not split evenly
            over the processes (see :func:`ddp_engine.distributed.layout.per_device_batch_size`).
    """

    #: The ``data`` keys that say where the data is and how it is loaded, not which samples it
    #: holds nor in which order: a resume in place may change them, and eval, predict and export
    #: of a checkpoint take the command's own values for them (``global_batch_size`` too, there).
    #: Every other key is the run's. A subclass adds its own (a folder: ``(*loading_keys, "root")``).
    loading_keys: ClassVar[tuple[str, ...]] = ("num_workers", "prepare_data_per_node", "on_device")
    #: The modules this DataModule's loader workers unpickle their datasets from, imported once by
    #: their forkserver (:meth:`start_loader_forkserver`); a worker imports any other itself, once.
    #: A subclass whose splits are another Dataset class names that class's module.
    worker_modules: ClassVar[tuple[str, ...]] = (GatherDataset.__module__,)

    def __init__(
        self,
        global_batch_size: int,
        num_workers: int = 0,
        shuffle_seed: int = 0,
        prepare_data_per_node: bool = True,
        on_device: bool = False,
    ) -> None:
        super().__init__()
        if num_workers < 0:
            raise ConfigValueError(f"data.num_workers={num_workers} must be 0 (load in the process) or more.")
        self.global_batch_size = global_batch_size
        self.num_workers = num_workers
        self.shuffle_seed = shuffle_seed
        self.prepare_data_per_node = prepare_data_per_node  # read by Lightning
        self.on_device = on_device
        self.train_set: Dataset | None = None
        self.val_set: Dataset | None = None
        self.test_set: Dataset | None = None
        # Where a resumed epoch continues (load_state_dict), until the training loader is built.
        self._train_position: dict | None = None

    def start_loader_forkserver(self) -> None:
        """With ``num_workers`` > 0, start the forkserver this process's DataLoader workers will be
        forked from (:func:`~ddp_engine.data.loader_workers.workers_context`) now and return at once:
        its imports (seconds) then run while the model is built and the process group forms, instead
        of before the first batch. Called by the engine in each DDP process; nothing without workers."""
        if self.num_workers > 0:
            workers_context(*self.worker_modules)

    def model_arguments(self) -> dict[str, Any]:
        """The keyword arguments of the task's LightningModule that come from the data, nested as
        the ``model`` config is (``{"net": {"channels": 3, ...}}`` gives ``model.net`` its
        input channels): the engine instantiates ``model`` with them (:func:`ddp_engine.models.build.build_model`).
        Called before any process starts and in each one; none by default."""
        return {}

    def model_arguments_of(self, checkpoint: Path) -> dict[str, Any] | None:
        """What the model saved in ``checkpoint`` was built for (as :meth:`model_arguments`), when the
        checkpoint keeps it: a prediction builds its model so and reads none of the data set's files.
        None (default): from :meth:`model_arguments`."""
        return None

    def check_splits(self) -> None:
        """Refuse a validation split that leaves no training sample (or no validation sample), cheaply,
        before any process starts. Nothing to check by default.

        Raises:
            ConfigValueError: in a subclass, naming the key and the split's size.
        """

    def check_checkpoint(self, checkpoint: Path) -> None:
        """Refuse ``checkpoint`` when it was trained on other data than this DataModule's (another
        input shape, other classes, another normalization), before eval, predict or export apply
        it. Nothing to check by default.

        Raises:
            ConfigValueError: in a subclass, naming the checkpoint and what differs.
        """

    def batch_samples(self, batch: Any) -> int:
        """The samples in one training ``batch`` (what throughput counts): by default the rows of its
        first tensor (:func:`count_samples`); override it for a batch whose first tensor is not one
        row per sample.

        Raises:
            TypeError: by default, for a batch that holds no tensor with a first dimension.
        """
        return count_samples(batch)

    def summary(self) -> str | None:
        """One line about the data for the job's log (``Data set: <summary>``, from global rank 0
        when training starts), or None (default) for none."""
        return None

    @property
    def serves_indices(self) -> bool:
        """Whether training batches carry their samples' indices ``(B,)`` int64 as their last
        element (for train-time draws keyed by sample, which a resume must repeat). False by default."""
        return False

    @property
    def per_device_batch_size(self) -> int:
        """Micro-batch size of one process under the attached Trainer."""
        return per_device_batch_size(
            self.global_batch_size, self.trainer.world_size, self.trainer.accumulate_grad_batches
        )

    @override
    def train_dataloader(self) -> DataLoader:
        dataset = self._split("train_set")
        if self.serves_indices:
            dataset = dataset.with_indices() if isinstance(dataset, GatherDataset) else WithIndices(dataset)
        # drop_last on the sampler: every rank gets the same number of samples, so no rank waits
        # in an AllReduce for a batch another rank never runs; at most world_size - 1 samples of
        # the train split are left out of each epoch (a different few each epoch). The loader's
        # position in the epoch goes into checkpoints, so a resume continues at the next global
        # batch, on any world size with this global batch (ddp_engine.data.sharding).
        sampler = ResumableDistributedSampler(
            dataset, num_replicas=self.trainer.world_size, rank=self.trainer.global_rank, seed=self.shuffle_seed
        )
        loader = ResumableDataLoader(
            dataset,
            sampler=sampler,
            # Lightning's count of this epoch's batches, read when a checkpoint is saved.
            trained_batches=lambda: epoch_batches_processed(self.trainer),
            global_batch_size=self.global_batch_size,
            **self._loader_options(dataset, self.per_device_batch_size),
        )
        if self._train_position:
            loader.load_state_dict(self._train_position)
            self._train_position = None
        return loader

    @override
    def val_dataloader(self) -> DataLoader:
        return self._eval_loader(self._split("val_set"))

    @override
    def test_dataloader(self) -> DataLoader:
        return self._eval_loader(self._split("test_set"))

    def _eval_loader(self, dataset: Dataset) -> DataLoader:
        batch_size = per_device_eval_batch_size(self.global_batch_size, self.trainer.world_size)
        return unrepeated_loader(
            dataset, self.trainer.world_size, self.trainer.global_rank, **self._loader_options(dataset, batch_size)
        )

    def _split(self, name: str) -> Dataset:
        """The split dataset ``name`` set by ``setup``, moved to the device once with ``on_device``."""
        dataset = getattr(self, name)
        if dataset is None:
            raise RuntimeError(f"{type(self).__name__}.setup() did not set {name}")
        if self.on_device:
            if self.num_workers > 0:
                raise ConfigValueError(
                    "data.on_device=true keeps the data on the GPU, which DataLoader workers cannot serve from: "
                    f"set data.num_workers=0 (not {self.num_workers}) or data.on_device=false."
                )
            device = self.trainer.strategy.root_device
            if isinstance(dataset, GatherDataset) and dataset.tensors[0].device != device:
                dataset = dataset.to(device)
                setattr(self, name, dataset)
        return dataset

    def _loader_options(self, dataset: Dataset, batch_size: int) -> dict[str, Any]:
        options = {
            "batch_size": batch_size,
            "collate_fn": collate_for(dataset),
            "num_workers": self.num_workers,
            "persistent_workers": self.num_workers > 0,
            # A loader draws its workers' base seed each time it starts an epoch, from torch's global
            # generator unless it has its own. The global one also draws the dropout masks, and a
            # resume inside an epoch starts the loader once more than the uninterrupted run did
            # (after the checkpoint restored the generator): the masks would shift from there on.
            # torch seeds each worker's torch, random and numpy from that base seed and its worker id;
            # the global rank in the seed gives each process's workers streams of their own.
            "generator": torch.Generator().manual_seed(self.shuffle_seed * WORKER_SEED_STRIDE + self._global_rank()),
        }
        if self.num_workers > 0:
            # Not forked from this process, which runs threads: see ddp_engine.data.loader_workers.
            options["multiprocessing_context"] = workers_context(*self.worker_modules, type(dataset).__module__)
            options["worker_init_fn"] = seeded_by_torch
        return options

    def _global_rank(self) -> int:
        return self.trainer.global_rank if self.trainer is not None else 0

    @override
    def state_dict(self) -> dict:
        # The training position, restored by load_state_dict before the loader exists. Lightning
        # also saves the loader's state itself, but restores it only when the loader is built after
        # the checkpoint's loops are loaded; a one-cycle schedule's length (configure_optimizers,
        # Trainer.estimated_stepping_batches) builds it earlier, and Lightning's copy is never used.
        loader = self.trainer.train_dataloader if self.trainer is not None else None
        return {"train_position": loader.state_dict()} if isinstance(loader, ResumableDataLoader) else {}

    @override
    def load_state_dict(self, state_dict: dict) -> None:
        self._train_position = state_dict.get("train_position")


def count_samples(batch: Any) -> int:
    """The rows of the first tensor in ``batch`` (a tensor, or tuples, lists and mappings of them:
    ``(inputs (B, ...), targets (B,))`` gives B), the samples of a batch that holds one row per sample.

    Raises:
        TypeError: when ``batch`` holds no tensor with at least one dimension first.
    """
    first = batch
    while isinstance(first, (tuple, list, dict)) and first:
        first = next(iter(first.values())) if isinstance(first, dict) else first[0]
    if isinstance(first, Tensor) and first.dim() > 0:
        return first.shape[0]
    raise TypeError(f"no tensor with a first dimension to count samples by in a {type(batch).__name__} batch")
