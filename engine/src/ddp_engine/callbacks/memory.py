"""Memory per device: where each replica's memory goes (parameters, gradients, optimizer state,
the rest), at the end of its first optimizer step and at the peak of the fit."""

import math
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.utilities import rank_zero_only
from torch.nn.parallel import DistributedDataParallel
from typing_extensions import override

from ddp_engine.callbacks.rank_metrics import gather_rows, log_on_rank_zero, logged_step
from ddp_engine.core.files import update_json
from ddp_engine.distributed.footprint import tensor_footprint

#: The figures of one snapshot, in the order every rank gathers them (bytes; NaN where absent).
FIGURES = (
    "parameters",
    "gradients",
    "ddp_buckets",
    "optimizer_state",
    "host_rss",
    "cuda_allocated",
    "cuda_reserved",
    "other",
)
#: The key of the memory figures in ``ddp.json``.
JSON_KEY = "memory"


def host_resident_bytes(peak: bool = False) -> int | None:
    """This process's resident memory (bytes): now (``VmRSS``), or its peak so far (``VmHWM``),
    from ``/proc/self/status`` (Linux; values in KiB there). None where there is no such file."""
    field = "VmHWM:" if peak else "VmRSS:"
    try:
        lines = Path("/proc/self/status").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        if line.startswith(field):
            return int(line.split()[1]) * 1024
    return None


class MemoryFootprint(L.Callback):
    """Logs, per rank, the bytes of parameters, gradients (with DDP's buckets), optimizer state
    and the rest, at the end of the first optimizer step of the fit and at its peak.

    The tensor figures are counted from the tensors (:func:`ddp_engine.distributed.footprint.tensor_footprint`:
    each storage once); the device's from CUDA's statistics (``torch.cuda.memory_allocated``,
    ``memory_reserved`` and their ``max_`` counterparts) on GPUs; the process's resident memory
    (``/proc/self/status``) on every device, beside them. Every rank measures its own, and the
    figures are gathered to rank 0 with one ``all_gather`` per snapshot.

    Two snapshots:

    - ``first_step``: at the end of the fit's first optimizer step (after a resume, the first step
      after it), once the optimizer has created its state. Process figures are those of that moment.
    - ``peak``: at the end of training. Each tensor figure is the larger of its values at the first
      step and at the end (Lightning frees the gradients after the last step; an optimizer may grow
      its state); ``host_rss`` is the process's peak resident memory (``VmHWM``),
      ``cuda_allocated`` / ``cuda_reserved`` the most held during the fit.

    Figures (bytes in ``ddp.json``; MiB = 2**20 bytes in TensorBoard): ``parameters``,
    ``gradients``, ``ddp_buckets``, ``optimizer_state``
    (see :class:`~ddp_engine.distributed.footprint.TensorFootprint`),
    ``host_rss``; on GPUs also ``cuda_allocated``, ``cuda_reserved`` and ``other``:
    ``cuda_allocated`` less the four tensor figures (activations, workspace, the allocator's
    rounding; at the peak, the activations at their largest).

    Written by global rank 0:

    - TensorBoard: ``memory/rank_{r}/{figure}_mib``, one tag per rank and figure, at the first
      step's index (the ``first_step`` snapshot) and at the last step's (``peak``). A resumed fit
      logs its peak only: the run's first step was logged before, by the attempt that took it.
    - ``path`` (``ddp.json``), at the end of training, under the top-level key ``"memory"`` (the
      file's other keys are kept): ``{"first_step": {"step": <step>, "ranks": [{figure: bytes}, ...]},
      "peak": {...}}``, ``ranks[r]`` from global rank ``r``; ``step`` is the snapshot's step in
      TensorBoard (:func:`~ddp_engine.callbacks.rank_metrics.logged_step`: the optimizer step's
      index, ``global_step - 1``; 0 for the run's first step).

    Args:
        path: the JSON file to merge the figures into (the default config: the run's ``ddp.json``).
    """

    def __init__(self, path: str) -> None:
        self.path = Path(path)
        self.snapshots: dict[str, dict] = {}
        self._start_step: int | None = None
        self._cuda_peaks = (0, 0)
        self._local_first_step: dict[str, float] = {}

    @override
    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.snapshots = {}
        self._start_step = trainer.global_step
        self._cuda_peaks = (0, 0)
        self._local_first_step = {}

    @override
    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs, batch, batch_idx) -> None:
        # global_step counts optimizer steps: it moves past the start at the first one (with
        # gradient accumulation, after the last micro-batch of the step).
        if "first_step" not in self.snapshots and trainer.global_step > (self._start_step or 0):
            self._snapshot(trainer, pl_module, "first_step", peak=False)

    @override
    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # The throughput monitor resets CUDA's peak statistics at each epoch's start: keep the
        # fit's peak here, at each epoch's end, before the next reset.
        self._note_cuda_peaks(pl_module)

    @override
    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if "first_step" not in self.snapshots:
            return  # no optimizer step in this fit: nothing was allocated for one
        self._note_cuda_peaks(pl_module)
        self._snapshot(trainer, pl_module, "peak", peak=True)
        self._write(trainer)

    def _note_cuda_peaks(self, pl_module: L.LightningModule) -> None:
        if pl_module.device.type == "cuda":
            allocated = torch.cuda.max_memory_allocated(pl_module.device)
            reserved = torch.cuda.max_memory_reserved(pl_module.device)
            self._cuda_peaks = (max(self._cuda_peaks[0], allocated), max(self._cuda_peaks[1], reserved))

    def _snapshot(self, trainer: L.Trainer, pl_module: L.LightningModule, name: str, peak: bool) -> None:
        """Measure this rank's figures, gather every rank's (a collective: all ranks call it at the
        same step), and log them on rank 0."""
        ddp = trainer.strategy.model if isinstance(trainer.strategy.model, DistributedDataParallel) else None
        figures: dict[str, float] = dict(tensor_footprint(pl_module, trainer.optimizers, ddp).to_dict())
        if peak:
            # Lightning frees the gradients after the last step: the peak holds the most each kind
            # held at either snapshot (this rank's first-step figures are in its row of the gather).
            first = self._local_first_step
            figures = {key: max(value, first.get(key, 0)) for key, value in figures.items()}
        else:
            self._local_first_step = dict(figures)
        rss = host_resident_bytes(peak=peak)
        figures["host_rss"] = math.nan if rss is None else rss
        if pl_module.device.type == "cuda":
            if peak:
                allocated, reserved = self._cuda_peaks
            else:
                allocated = torch.cuda.memory_allocated(pl_module.device)
                reserved = torch.cuda.memory_reserved(pl_module.device)
            tensors = figures["parameters"] + figures["gradients"] + figures["ddp_buckets"] + figures["optimizer_state"]
            figures.update(cuda_allocated=allocated, cuda_reserved=reserved, other=allocated - tensors)
        # float64 holds every byte count below 2**53 (8 PiB) exactly; on the strategy's device, where
        # its backend gathers (NCCL: the GPU).
        values = [figures.get(key, math.nan) for key in FIGURES]
        local = torch.tensor(values, dtype=torch.float64, device=trainer.strategy.root_device)
        gathered = gather_rows(trainer, pl_module, local).tolist()
        ranks = [{key: int(value) for key, value in zip(FIGURES, row) if not math.isnan(value)} for row in gathered]
        # The step of its TensorBoard points (and of train/loss there), not the count of steps taken.
        self.snapshots[name] = {"step": logged_step(trainer), "ranks": ranks}
        # A resumed fit's first step is not the run's: the run's own was logged by its first
        # attempt, and TensorBoard and CSV keep that point (they purge only those after the
        # checkpoint), so a resumed run shows the points of an uninterrupted one.
        resumed = (self._start_step or 0) > 0
        if not (name == "first_step" and resumed):
            metrics = {
                f"memory/rank_{rank}/{key}_mib": value / 2**20
                for rank, row in enumerate(ranks)
                for key, value in row.items()
            }
            log_on_rank_zero(trainer, metrics)

    @rank_zero_only
    def _write(self, trainer: L.Trainer) -> None:
        update_json(self.path, {JSON_KEY: self.snapshots})
