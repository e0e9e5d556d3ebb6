"""A check, for your own tests, that a DataModule keeps the guarantees of
:class:`~ddp_engine.data.sharded.ShardedDataModule` under DDP (:func:`check_conformance`), whatever its samples.

What it proves, on real gloo process groups of each world size ``W`` (2 and 3 by default), each
process running a real Lightning ``Trainer(accelerator="cpu", devices=W, strategy="ddp",
use_distributed_sampler=False)`` on a probe model that records every batch it is fed:

- training: over 2 epochs, every sample of ``train_set`` is trained exactly once per epoch across
  the ranks (none twice; at most ``W - 1`` left out, the remainder the sampler drops), in global
  batches of ``global_batch_size``, and the order changes from one epoch to the next;
- evaluation: the validation loader (in each epoch's validation) and the test loader serve every
  sample of ``val_set`` / ``test_set`` to exactly one rank: none padded in twice, none missing;
- resume: a fit interrupted inside the first epoch (a checkpoint saved by
  ``trainer.save_checkpoint`` after step ``k``, then stopped) and resumed with
  ``trainer.fit(..., ckpt_path=...)`` trains exactly the global batches that the uninterrupted
  run trains from step ``k`` on (and the interrupted fit trained the uninterrupted one's first
  ``k``: the order is reproducible); resumed on the next world size of ``world_sizes`` too, and
  there the uninterrupted runs of both world sizes train the same samples in every full global
  batch (the template's promise: the ``k``-th global batch is the same samples whatever ``W`` is).

How: the processes are started by torch's elastic agent (as torchrun starts them), so Lightning
reads ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``MASTER_ADDR`` and ``MASTER_PORT`` and starts no
process itself. In each process the DataModule is built from ``data`` with Hydra's
``instantiate``, and its ``on_after_batch_transfer`` is wrapped to identify every sample of
every batch by its content (a hash of its inputs and its target, their dtypes and shapes)
*before* normalization and augmentation. The processes return their records to this process,
which compares them with the split datasets themselves, iterated here (as multisets: duplicate
images in a data set are fine) and raises :class:`ConformanceError` at the first fault found,
with a one-line message that names the fault and where to look.

Use it from a test of your own project (each launch starts ``W`` processes and costs a few
seconds; keep the splits small, a few hundred samples)::

    from ddp_engine.data.conformance import check_conformance

    def test_my_datamodule_conforms(tmp_path):
        report = check_conformance({"_target_": "my_project.data.MyDataModule", "root": str(tmp_path)})
        train = report.split_sizes["train"]
        assert report.world_sizes[3].trained_per_epoch == (train - train % 3,) * 2

The DataModule's class must be importable in the new processes: forked (the default), they
inherit this process's modules and ``sys.path``; spawned, they get its ``sys.path`` and import
the class by name. Its ``prepare_data`` and ``setup`` are also called here, without a Trainer, to
read the splits.
"""

import ctypes
import faulthandler
import hashlib
import logging
import math
import os
import signal
import tempfile
import threading
import time
import uuid
import warnings
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import lightning as L
import torch
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf
from torch import Tensor, nn
from torch.utils.data import DataLoader, Dataset

from ddp_engine.core.compat import epoch_batches_ready
from ddp_engine.core.errors import UsageError
from ddp_engine.data.gather import collate_for

#: ``(epoch, global batch index within the epoch)``: a global batch, the same key on every world size.
_BatchKey = tuple[int, int]
#: The signals torch's elastic agent handles (its default ``TORCHELASTIC_SIGNALS_TO_HANDLE``).
_AGENT_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)


class ConformanceError(UsageError):
    """A DataModule breaks a guarantee of the template under DDP; the one-line message names the
    guarantee, the world size, the counts, and where to look."""


@dataclass(frozen=True)
class WorldSizeReport:
    """What the check saw on one world size.

    Attributes:
        world_size: the number of processes.
        steps_per_epoch: global batches (optimizer steps) trained in each epoch.
        trained_per_epoch: samples trained in each epoch, summed over the ranks.
        left_out_per_epoch: samples of ``train_set`` not trained in each epoch (the remainder the
            sampler drops, at most ``world_size - 1``; with ``steps``, all beyond them too).
        evaluated: samples evaluated over the ranks, by loop: ``"validation of epoch 0"``,
            ``"validation of epoch 1"``, ``"test"``.
        resumed: for each checkpoint resumed on this world size, keyed by the world size that
            wrote it: the global batches compared with the uninterrupted run after the resume.
        seconds: wall-clock time of this world size's launch.
    """

    world_size: int
    steps_per_epoch: tuple[int, ...]
    trained_per_epoch: tuple[int, ...]
    left_out_per_epoch: tuple[int, ...]
    evaluated: dict[str, int]
    resumed: dict[int, int]
    seconds: float


@dataclass(frozen=True)
class ConformanceReport:
    """The result of a passed :func:`check_conformance`.

    Attributes:
        target: the DataModule's class (``data._target_``).
        global_batch_size: the global batch the check trained with.
        resume_step: the optimizer step of the first epoch after which the interrupted runs saved
            their checkpoint.
        split_sizes: samples in each split dataset (``"train"``, ``"val"``, ``"test"``).
        world_sizes: one :class:`WorldSizeReport` per world size checked, in the order checked (a
            world size given twice, ``(2, 3, 2)``: its last launch's).
    """

    target: str
    global_batch_size: int
    resume_step: int
    split_sizes: dict[str, int]
    world_sizes: dict[int, WorldSizeReport] = field(default_factory=dict)


def check_conformance(
    data: Mapping | DictConfig,
    world_sizes: Sequence[int] = (2, 3),
    steps: int | None = None,
    resume_step: int | None = None,
    global_batch_size: int | None = None,
    epochs: int = 2,
    timeout: float = 300.0,
    start_method: str = "fork",
) -> ConformanceReport:
    """Prove on real DDP processes that the DataModule ``data`` describes shards training, evaluates
    exactly and resumes exactly (see the module's docstring); raise at the first fault.

    Args:
        data: the ``data`` config node: ``{"_target_": "<module>.<DataModule class>", **its
            arguments}``, built in every process with ``hydra.utils.instantiate`` (interpolations
            are resolved first; ``${hydra:...}`` ones cannot be, outside a Hydra run).
        world_sizes: the numbers of processes to check, in this order (default 2, then 3). Each
            world size after the first also resumes the checkpoint of the one before it, so
            ``(2, 3, 2)`` resumes in both directions.
        steps: global batches trained per epoch; None (default): whole epochs, which the check
            needs to prove that every sample is reached. With a number, it proves only that no
            sample is trained twice and that each batch holds ``global_batch_size`` samples.
        resume_step: the optimizer step of the first epoch after which the interrupted run saves
            its checkpoint (``1`` or more, before the epoch's last); default: half the epoch.
        global_batch_size: samples per optimizer step over all processes; default ``data``'s own
            ``global_batch_size`` if it sets one, else the least multiple of every world size that is
            12 or more (12 for 2 and 3, 16 for 8). Every world size must divide it.
        epochs: epochs of each uninterrupted run (at least 2, to see the order change).
        timeout: seconds each launch may take; a process still running then (a hang: a collective
            that another rank never joins) ends the check with a :class:`ConformanceError`.
        start_method: how the elastic agent starts the processes: ``"fork"`` (default: they
            inherit the imported torch and Lightning, which saves seconds per launch) or
            ``"spawn"`` (a fresh interpreter each, for a process whose state must not be copied:
            one that initialized CUDA).

    Returns:
        A :class:`ConformanceReport` of the counts seen.

    Raises:
        ConformanceError: a guarantee broken (the message names which, on which world size, and
            where to look), a process that failed (its rank and error) or hung, or arguments that
            cannot be checked (a global batch that a world size does not divide, an epoch too short
            to resume inside).
    """
    config = _plain_config(data)
    world_sizes = tuple(int(size) for size in world_sizes)
    if not world_sizes or min(world_sizes) < 1:
        raise ConformanceError(f"world_sizes={list(world_sizes)}: give one or more numbers of processes (2, 3).")
    if epochs < 2:
        raise ConformanceError(f"epochs={epochs}: the check needs 2 or more to see the order change between epochs.")
    # A few samples per rank and step, so that a sampler's off-by-one shows, and few steps per epoch.
    divisible = math.lcm(*world_sizes) * math.ceil(12 / math.lcm(*world_sizes))
    global_batch_size = int(global_batch_size or config.get("global_batch_size") or divisible)
    if undivided := [size for size in world_sizes if global_batch_size % size]:
        raise ConformanceError(
            f"global_batch_size={global_batch_size} does not divide by world_size={undivided[0]}: give one that "
            f"every world size divides ({divisible} for {list(world_sizes)})."
        )
    config["global_batch_size"] = global_batch_size

    reference = _read_splits(config)
    sizes = {split: sum(ids.values()) for split, ids in reference.items()}
    # The base class's layout: W * floor(N / W) samples per epoch in micro-batches of G / W per rank.
    epoch_steps = {size: math.ceil((sizes["train"] // size) / (global_batch_size // size)) for size in set(world_sizes)}
    if steps is not None:
        epoch_steps = {size: min(count, steps) for size, count in epoch_steps.items()}
    shortest = min(epoch_steps.values())
    if resume_step is None:
        resume_step = shortest // 2
    if not 1 <= resume_step < shortest:
        raise ConformanceError(
            f"resume: no step {resume_step} inside the first epoch to resume at: the {sizes['train']} training "
            f"samples make {shortest} global batches of {global_batch_size} per epoch; give a resume_step between "
            "1 and the epoch's last step, a smaller global_batch_size or a larger train split."
        )

    report = ConformanceReport(str(config.get("_target_")), global_batch_size, resume_step, sizes)
    with tempfile.TemporaryDirectory(prefix="ddp-engine-conformance-") as folder:
        previous: tuple[int, Path, _Run] | None = None  # world size, its checkpoint, its uninterrupted run
        for index, size in enumerate(world_sizes):
            checkpoint = Path(folder) / f"interrupted-{index}-world_size{size}.ckpt"
            plan = _Plan(
                world_size=size, epochs=epochs, steps=steps, resume_step=resume_step, checkpoint=str(checkpoint),
                resume_from={previous[0]: str(previous[1])} if previous else {}, timeout=timeout,
                supervisor_pid=os.getpid(), root_dir=folder,
            )  # fmt: skip
            started = time.monotonic()
            runs = _launch(config, plan, start_method, Path(folder))
            trained = _check_training(runs["uninterrupted"], reference["train"], plan, global_batch_size)
            evaluated = _check_evaluation(runs["uninterrupted"], reference, size)
            _check_reproducible(runs["interrupted"], runs["uninterrupted"], size, resume_step)
            resumed = {size: _check_resume(runs["resumed"], runs["uninterrupted"], size, size, resume_step)}
            if previous:
                source, _, source_run = previous
                _check_same_global_batches(source_run, runs["uninterrupted"], source, size, global_batch_size)
                resumed[source] = _check_resume(
                    runs[f"resumed from {source}"], runs["uninterrupted"], source, size, resume_step
                )
            report.world_sizes[size] = WorldSizeReport(
                size, *trained, evaluated, resumed, round(time.monotonic() - started, 1)
            )
            previous = (size, checkpoint, runs["uninterrupted"])
    return report


def _plain_config(data: Mapping | DictConfig) -> dict:
    """``data`` as a plain dict with its interpolations resolved (it travels to the processes)."""
    if isinstance(data, DictConfig):
        config = OmegaConf.to_container(data, resolve=True)
    else:
        config = OmegaConf.to_container(OmegaConf.create(dict(data)), resolve=True)
    if "_target_" not in config:
        raise ConformanceError(
            "data has no _target_: give the DataModule's config node, {'_target_': 'my_project.MyDataModule', ...}."
        )
    return config


# The reference: the split datasets, iterated in this process.


def _read_splits(config: dict) -> dict[str, Counter]:
    """The sample ids of each split dataset (``train``, ``val``, ``test``), as ``setup`` sets them,
    after ``prepare_data`` (which the training command also runs once before any process starts)."""
    datamodule = instantiate(config)
    datamodule.prepare_data()
    datamodule.setup("fit")
    datamodule.setup("test")
    splits = {}
    for split in ("train", "val", "test"):
        dataset = getattr(datamodule, f"{split}_set", None)
        if dataset is None:
            raise ConformanceError(
                f"{split}: {type(datamodule).__name__}.setup() did not set {split}_set (setup('fit') sets train_set "
                "and val_set, setup('test') test_set)."
            )
        splits[split] = _dataset_ids(dataset)
    return splits


def _dataset_ids(dataset: Dataset) -> Counter:
    """Every sample's id (:func:`sample_ids`), counted, read as the loaders read it (the same collate)."""
    ids = Counter()
    for inputs, targets, *_ in DataLoader(dataset, batch_size=256, collate_fn=collate_for(dataset)):
        ids.update(sample_ids(inputs, targets))
    return ids


def sample_ids(inputs: Tensor, targets: Tensor) -> list[str]:
    """One id per sample of a batch: a SHA-1 of its inputs' and its target's bytes, dtypes and shapes.

    Args:
        inputs: ``(B, ...)``, as the loader serves them (uint8 ``(B, C, H, W)`` images, float
            ``(B, C, L)`` sequences, ...).
        targets: ``(B, ...)``: class labels ``(B,)``, regression targets ``(B, K)``, ...

    Returns:
        ``B`` hex strings (20 characters); equal samples get equal ids.
    """
    parts = []
    for tensor in (inputs, torch.as_tensor(targets)):
        tensor = tensor.detach().cpu().contiguous()
        header = f"{tensor.dtype}{tuple(tensor.shape[1:])}|".encode()
        parts.append([header + row.tobytes() for row in tensor.reshape(len(tensor), -1).numpy()])
    return [hashlib.sha1(b"".join(sample)).hexdigest()[:20] for sample in zip(*parts)]


# The comparisons, in this process.


def _samples(count: int, singular: str = "", plural: str = "") -> str:
    """``"1 sample"``, ``"3 samples"``, followed by the verb for the count when given (``"1 sample was"``)."""
    noun = f"{count} sample{'s' * (count != 1)}"
    return f"{noun} {_verb(count, singular, plural)}" if singular else noun


def _verb(count: int, singular: str, plural: str) -> str:
    return singular if count == 1 else plural


@dataclass
class _Run:
    """One fit's records merged over the ranks."""

    #: Each global batch's sample ids, summed over the ranks.
    train: dict[_BatchKey, Counter]
    #: Each evaluation's sample ids over the ranks, by loop (``"validation of epoch 0"``, ``"test"``).
    evaluated: dict[str, Counter]


def _check_training(run: _Run, split: Counter, plan: "_Plan", global_batch_size: int) -> tuple[tuple[int, ...], ...]:
    """Every epoch trains each sample of ``split`` once, in global batches of ``global_batch_size``,
    in a new order; returns the steps, samples trained and samples left out of each epoch."""
    size, total = plan.world_size, sum(split.values())
    steps, trained_counts, left_out_counts, orders = [], [], [], []
    for epoch in range(plan.epochs):
        where = f"in epoch {epoch} on world_size={size}"
        batches = [run.train[key] for key in sorted(run.train) if key[0] == epoch]
        trained = sum(batches, Counter())
        # A sample that train_set holds n times may be trained n times (multisets).
        if repeated := sum(max(0, count - split[sample]) for sample, count in trained.items() if sample in split):
            raise ConformanceError(
                f"training: {_samples(repeated, 'was', 'were')} trained more than once {where}: each rank must train "
                "its own shard of train_set (ShardedDataModule.train_dataloader, a DistributedSampler)."
            )
        if foreign := sum(count for sample, count in trained.items() if sample not in split):
            raise ConformanceError(
                f"training: {_samples(foreign)} trained {where} {_verb(foreign, 'is not one', 'are not')} of "
                "train_set's: the training loader must serve setup()'s train_set as it is, (inputs, targets), and "
                "transform them in on_after_batch_transfer (ShardedDataModule)."
            )
        left_out = sum((split - trained).values())
        if plan.steps is None and left_out > size - 1:
            raise ConformanceError(
                f"training: {left_out} of the {_samples(total)} of train_set {_verb(left_out, 'was', 'were')} not "
                f"trained {where} (at most {size - 1}, the remainder the sampler drops, may be left out): the ranks' "
                "shards must cover the split (ShardedDataModule.train_dataloader, a DistributedSampler)."
            )
        for index, batch in enumerate(batches):
            count = sum(batch.values())
            if count > global_batch_size or (count < global_batch_size and index < len(batches) - 1):
                raise ConformanceError(
                    f"training: global batch {index} {where} holds {_samples(count)}, not "
                    f"global_batch_size={global_batch_size}: each rank must load global_batch_size / world_size "
                    "samples per step (ShardedDataModule.per_device_batch_size)."
                )
        steps.append(len(batches))
        trained_counts.append(sum(trained.values()))
        left_out_counts.append(left_out)
        orders.append([sorted(batch.elements()) for batch in batches])
    if repeats := [epoch for epoch, order in enumerate(orders) if epoch and order == orders[0]]:
        raise ConformanceError(
            f"training: epoch {repeats[0]} trained the samples in the same order as epoch 0 on world_size={size}: "
            "the sampler must reshuffle every epoch (a DistributedSampler with shuffle=True, whose set_epoch "
            "Lightning calls)."
        )
    return tuple(steps), tuple(trained_counts), tuple(left_out_counts)


def _check_evaluation(run: _Run, reference: dict[str, Counter], size: int) -> dict[str, int]:
    """Each validation and the test served every sample of its split to exactly one rank; returns
    the samples evaluated by each."""
    evaluated = {}
    for loop, seen in sorted(run.evaluated.items(), key=lambda item: (item[0] == "test", item[0])):
        split = "test" if loop == "test" else "val"
        expected, total, where = reference[split], sum(reference[split].values()), f"in the {loop} on world_size={size}"
        hook = f"ShardedDataModule.{split}_dataloader: unrepeated_loader"
        if repeated := sum(max(0, count - expected[sample]) for sample, count in seen.items() if sample in expected):
            raise ConformanceError(
                f"{split}: {_samples(repeated, 'was', 'were')} evaluated more than once {where} (padding?): "
                f"evaluation needs each sample on exactly one rank ({hook})."
            )
        if foreign := sum(count for sample, count in seen.items() if sample not in expected):
            raise ConformanceError(
                f"{split}: {_samples(foreign)} evaluated {where} {_verb(foreign, 'is not one', 'are not')} of "
                f"{split}_set's: the loader must serve setup()'s {split}_set as it is ({hook})."
            )
        if missing := sum((expected - seen).values()):
            raise ConformanceError(
                f"{split}: {missing} of the {_samples(total)} of {split}_set {_verb(missing, 'was', 'were')} not "
                f"evaluated {where}: evaluation needs every sample on exactly one rank, none dropped ({hook})."
            )
        evaluated[loop] = sum(seen.values())
    for split in ("val", "test"):
        if not any((loop == "test") == (split == "test") for loop in evaluated):
            raise ConformanceError(
                f"{split}: no {split} batch was evaluated on world_size={size}: is {split}_set empty?"
            )
    return evaluated


def _check_reproducible(interrupted: _Run, uninterrupted: _Run, size: int, step: int) -> None:
    """The interrupted run trained the uninterrupted run's first ``step`` global batches: a resume can
    only continue an order that every fit of the same seed repeats."""
    keys = sorted(set(interrupted.train) | {(0, index) for index in range(step)})
    if differing := [key for key in keys if interrupted.train.get(key) != uninterrupted.train.get(key)]:
        epoch, index = differing[0]
        raise ConformanceError(
            f"resume: a second fit on world_size={size} trained other samples than the first in its first {step} "
            f"global batches ({len(differing)} differ, the first at step {index} of epoch {epoch}): the training "
            "order must be the same in every fit of a seed (a DistributedSampler with seed=shuffle_seed), or a "
            "resume cannot continue it."
        )


def _check_resume(resumed: _Run, uninterrupted: _Run, source: int, size: int, step: int) -> int:
    """The run resumed on ``size`` from the checkpoint that ``source`` processes saved after ``step``
    trains the global batches of the uninterrupted run on ``size`` from there on; returns how many."""
    keys = sorted({key for key in uninterrupted.train if key >= (0, step)} | set(resumed.train))
    differing = [key for key in keys if resumed.train.get(key) != uninterrupted.train.get(key)]
    if differing:
        epoch, index = differing[0]
        checkpoint = "" if source == size else f" (a checkpoint of world_size={source})"
        raise ConformanceError(
            f"resume: after resuming at step {step}{checkpoint} on world_size={size} the run trained other samples "
            f"than the uninterrupted run: {len(differing)} of {len(keys)} global batches from step {step} on differ, "
            f"the first at step {index} of epoch {epoch}: the training loader must continue the epoch where the "
            "checkpoint left it (ShardedDataModule.state_dict / load_state_dict, ResumableDataLoader)."
        )
    return len(keys)


def _check_same_global_batches(first: _Run, second: _Run, first_size: int, size: int, global_batch_size: int) -> None:
    """Every global batch that is full on both world sizes holds the same samples on both (only the
    epoch's last batch, cut by the remainder, may differ): what a resume on another world size needs."""
    full = lambda run: {key for key, batch in run.train.items() if sum(batch.values()) == global_batch_size}  # noqa: E731
    keys = sorted(full(first) & full(second))
    if differing := [key for key in keys if first.train[key] != second.train[key]]:
        epoch, index = differing[0]
        raise ConformanceError(
            f"resume: world_size={size} trains other global batches than world_size={first_size} ({len(differing)} "
            f"of {len(keys)} differ, the first at step {index} of epoch {epoch}): a checkpoint resumed on another "
            "world size would continue in another order; each global batch must be the same samples whatever the "
            "world size (one permutation per epoch, dealt to the ranks in turn: ResumableDistributedSampler)."
        )


# Starting the processes.


@dataclass(frozen=True)
class _Plan:
    """What every process of one launch runs (see :func:`_worker`)."""

    world_size: int
    epochs: int
    steps: int | None
    resume_step: int
    #: Where the interrupted run saves its checkpoint.
    checkpoint: str
    #: Checkpoints of other world sizes to resume here, by the world size that saved them.
    resume_from: dict[int, str]
    timeout: float
    supervisor_pid: int
    root_dir: str


def _launch(config: dict, plan: _Plan, start_method: str, folder: Path) -> dict[str, _Run]:
    """Run :func:`_worker` in ``plan.world_size`` processes under torch's elastic agent and merge
    their records by run.

    Raises:
        ConformanceError: naming the rank that failed first and its error, or the hang.
    """
    # Imported here: the launcher is only needed by the check, not by the DataModules.
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    from ddp_engine.distributed.failures import describe_failure, root_failure

    logs = folder / f"logs-{uuid.uuid4().hex[:8]}"
    launch = LaunchConfig(
        min_nodes=1,
        max_nodes=1,
        nproc_per_node=plan.world_size,
        run_id=f"conformance-{uuid.uuid4().hex}",
        # torchrun --standalone's rendezvous: the agent's TCP store on a free port the OS picks
        # when it binds (port 0), so two checks at once (pytest -n) never collide.
        rdzv_backend="c10d",
        rdzv_endpoint="127.0.0.1:0",
        rdzv_configs={"timeout": int(max(plan.timeout, 60))},
        max_restarts=0,
        monitor_interval=0.1,
        start_method=start_method,
        # A failed rank's peers are stopped with SIGTERM, then SIGKILL after this: one blocked in a
        # collective never gets to handle the SIGTERM.
        shutdown_timeout=5,
        # Each process's error file (torch's ErrorHandler): the parent reads the failing rank's error.
        logs_specs=DefaultLogsSpecs(log_dir=str(logs)),
    )
    # The agent installs its own handlers of these signals in this process, to stop the processes
    # it started, and leaves them there: after the check, Ctrl-C would raise its SignalException
    # instead of KeyboardInterrupt (which pytest reports as an interrupted run).
    handlers = {signum: signal.getsignal(signum) for signum in _AGENT_SIGNALS}
    try:
        results = elastic_launch(launch, _worker)(config, plan)
    except ChildFailedError as failed:
        rank, failure = root_failure({**_recorded_failures(logs), **failed.failures})
        raise ConformanceError(
            f"{config['_target_']} failed on world_size={plan.world_size}, rank {rank}: {describe_failure(failure)} "
            "(the processes' output holds its traceback)."
        ) from None
    finally:
        if threading.current_thread() is threading.main_thread():  # the agent sets none elsewhere
            for signum, handler in handlers.items():
                if handler is not None:  # None: set outside Python, cannot be restored from it
                    signal.signal(signum, handler)
    runs: dict[str, _Run] = {}
    for result in results.values():
        for name, records in result.items():
            run = runs.setdefault(name, _Run({}, {}))
            for epoch, index, ids in records["train"]:
                run.train.setdefault((epoch, index), Counter()).update(ids)
            for loop, ids in records["evaluated"]:
                run.evaluated.setdefault(loop, Counter()).update(ids)
    return runs


def _recorded_failures(logs: Path) -> dict[int, Any]:
    """``{rank: ProcessFailure}`` from the error file of every rank that recorded an exception.

    The agent reports only the ranks that had ended when it first saw one fail: a rank's exception
    closes its gloo connections as the process ends, and its peer, failing on the lost connection,
    may be seen first. The first rank's error file is written before that, as it raises."""
    from torch.distributed.elastic.multiprocessing.errors import ProcessFailure

    failures = {}
    for error_file in logs.glob("*/attempt_*/*/error.json"):  # DefaultLogsSpecs: <run>/attempt_<n>/<local rank>/
        try:
            failures[int(error_file.parent.name)] = ProcessFailure(int(error_file.parent.name), 0, 1, str(error_file))
        except (ValueError, OSError):  # a file cut off by the agent's SIGKILL: the agent's own report stands
            continue
    return failures


# In each process.


def _worker(config: dict, plan: _Plan) -> dict[str, dict]:
    """One rank of a launch: the uninterrupted fit (and test), the fit interrupted after
    ``plan.resume_step``, and the resumes of its checkpoint and of ``plan.resume_from``'s.

    Returns:
        Per run, the records of this rank (see :class:`_Recorder`); the agent hands them to the parent.
    """
    _end_with_supervisor(plan.supervisor_pid)
    # A forked process inherits the agent's handlers, which would turn the agent's SIGTERM (sent to
    # this rank when another one failed) into an exception of this rank's own, and the report would
    # name this rank instead of the one that failed first.
    for signum in _AGENT_SIGNALS:
        signal.signal(signum, signal.default_int_handler if signum == signal.SIGINT else signal.SIG_DFL)
    _exit_after(plan.timeout, plan.world_size)
    # The probe computes next to nothing; threads per process on a machine with fewer cores than
    # processes would only compete.
    torch.set_num_threads(1)
    for name in ("lightning.pytorch", "lightning.fabric"):  # "GPU available: False", once per fit and rank
        logging.getLogger(name).setLevel(logging.WARNING)
    from lightning.pytorch.utilities.warnings import PossibleUserWarning

    warnings.filterwarnings("ignore", category=PossibleUserWarning)  # "few batches", "no workers": the check's data
    runs = {"uninterrupted": _fit(config, plan, test=True)}
    runs["interrupted"] = _fit(config, plan, save_at=plan.resume_step)
    if not Path(plan.checkpoint).is_file():  # every rank reads the file: rank 0 wrote it, then all met in a barrier
        raise ConformanceError(
            f"resume: the interrupted run on world_size={plan.world_size} ended before step {plan.resume_step}, "
            "where it was to save its checkpoint: does its training loader serve that many batches?"
        )
    runs["resumed"] = _fit(config, plan, checkpoint=plan.checkpoint)
    for source, checkpoint in plan.resume_from.items():
        runs[f"resumed from {source}"] = _fit(config, plan, checkpoint=checkpoint)
    return runs


def _fit(config: dict, plan: _Plan, test: bool = False, save_at: int | None = None, checkpoint: str | None = None):
    """One ``trainer.fit`` of the probe on a new DataModule from ``config`` (then ``trainer.test``
    with ``test``): saves a checkpoint after step ``save_at`` and stops there, or resumes from
    ``checkpoint``. Returns what the DataModule served (:attr:`_Recorder.records`)."""
    datamodule = instantiate(config)
    recorder = _Recorder(datamodule)
    callbacks = [_SaveAndStop(save_at, plan.checkpoint)] if save_at is not None else []
    trainer = L.Trainer(
        accelerator="cpu", devices=plan.world_size, strategy="ddp", num_nodes=1, use_distributed_sampler=False,
        max_epochs=plan.epochs, limit_train_batches=plan.steps if plan.steps is not None else 1.0,
        num_sanity_val_steps=0, callbacks=callbacks, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, log_every_n_steps=1, default_root_dir=plan.root_dir,
    )  # fmt: skip
    probe = _Probe()
    # The check's checkpoints hold tensors and plain values only (the DataModule's position included).
    trainer.fit(probe, datamodule=datamodule, ckpt_path=checkpoint, weights_only=True)
    if test:
        trainer.test(probe, datamodule=datamodule, verbose=False)
    return recorder.records


class _Recorder:
    """Wraps a DataModule's ``on_after_batch_transfer`` to record the ids of every batch's samples
    as the loader served them, before the DataModule normalizes or augments them.

    Attributes:
        records: ``{"train": [(epoch, batch index in the epoch, ids)], "evaluated": [(loop, ids)]}``,
            ``loop`` being ``"validation of epoch <e>"`` or ``"test"``.
    """

    def __init__(self, datamodule: L.LightningDataModule) -> None:
        self.records: dict[str, list] = {"train": [], "evaluated": []}
        original = datamodule.on_after_batch_transfer

        def recording(batch: Any, dataloader_idx: int) -> Any:
            trainer = datamodule.trainer
            inputs, targets = batch[0], batch[1]
            if trainer.training:
                # Lightning counts the epoch's batches once this hook has returned: this batch's index,
                # which a resumed run restores from the checkpoint.
                index = epoch_batches_ready(trainer)
                self.records["train"].append((trainer.current_epoch, index, sample_ids(inputs, targets)))
            elif trainer.validating:
                loop = f"validation of epoch {trainer.current_epoch}"
                self.records["evaluated"].append((loop, sample_ids(inputs, targets)))
            elif trainer.testing:
                self.records["evaluated"].append(("test", sample_ids(inputs, targets)))
            return original(batch, dataloader_idx)

        # An attribute of the instance: Lightning calls the DataModule's hook by name (getattr).
        datamodule.on_after_batch_transfer = recording


class _Probe(L.LightningModule):
    """The model of the check: one parameter, so that DDP has a gradient to AllReduce every step,
    as a real model does (a rank that trained more batches than the others would hang there)."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(()))

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        return self.weight * batch[0].float().mean()

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        pass

    def test_step(self, batch: Any, batch_idx: int) -> None:
        pass

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


class _SaveAndStop(L.Callback):
    """After optimizer step ``step``: save a checkpoint to ``path`` (every rank calls it; rank 0 writes),
    then stop the fit, as an interrupted run leaves it (where ``ModelCheckpoint(every_n_train_steps)``
    saves too)."""

    def __init__(self, step: int, path: str) -> None:
        self.step, self.path = step, path

    def on_train_batch_end(self, trainer: L.Trainer, *args: Any) -> None:
        if trainer.global_step == self.step:
            trainer.save_checkpoint(self.path)
            trainer.should_stop = True


def _end_with_supervisor(supervisor_pid: int) -> None:
    """Have the kernel SIGKILL this process when the check's process dies, however it dies (Linux
    ``PR_SET_PDEATHSIG``): no orphan outlives a killed test run."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # 1: PR_SET_PDEATHSIG (linux/prctl.h)
    if os.getppid() != supervisor_pid:  # it died before the request took effect
        os._exit(128 + signal.SIGKILL)


def _exit_after(seconds: float, world_size: int) -> None:
    """End this process ``seconds`` from now if it is still running: write every thread's stack to
    stderr and a ``TimeoutError`` into its error file (which the parent reads), then exit, so that the
    agent stops the other ranks and the check ends with the hang named instead of waiting on it."""
    from torch.distributed.elastic.multiprocessing.errors import ErrorHandler

    def watch() -> None:
        time.sleep(seconds)
        faulthandler.dump_traceback(all_threads=True)
        error = TimeoutError(
            f"still running after {seconds:g} s on world_size={world_size}: a hang, in a collective that another "
            "rank never joins (one rank training more batches than another?); every thread's stack is in its output"
        )
        ErrorHandler().record_exception(error)
        os._exit(1)

    threading.Thread(target=watch, name="conformance-timeout", daemon=True).start()
