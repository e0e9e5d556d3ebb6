"""Where a DDP training step's time goes, on every rank: compute, communication, and the wait between.

The gradient AllReduce of each bucket starts while the backward pass still computes the gradients
of the buckets before it; only the part that outlasts the backward pass (the exposed
communication) makes a step longer. A run that scales badly shows it there: exposed communication
that grows with the world size, or one rank whose step is longer than the others' (a straggler,
which every other rank waits for in the AllReduce).
"""

import logging
import math
from collections import deque
from dataclasses import dataclass
from pathlib import Path

import lightning as L
import torch
from typing_extensions import override

from ddp_engine.callbacks.rank_metrics import clock, gather_rows, log_on_rank_zero
from ddp_engine.core.compat import ddp_logging_data, logs_this_step, sample_ddp_runtime_every
from ddp_engine.core.files import update_json
from ddp_engine.distributed.checkpoint_io import at_optimizer_step_boundary

log = logging.getLogger(__name__)

#: The parts of a step, in the order of the gathered rows (milliseconds each).
PARTS = ("forward", "backward_compute", "allreduce", "exposed_comm", "data_wait", "optimizer", "step")


@dataclass
class _HostTimes:
    """The parts of one optimizer step timed by this callback (seconds, ``time.perf_counter``)."""

    data_wait: float
    start: float
    before_optimizer: float = math.nan
    end: float = math.nan


class StepAnatomy(L.Callback):
    """Logs, per global rank, where a training step's time goes (milliseconds), every
    ``log_every_n_steps`` optimizer steps, gathered to global rank 0 with one ``all_gather``.

    Tags ``step/rank_{r}/<part>_ms``, on the optimizer-step axis of ``train/loss``:

    - ``forward``: from the DDP forward's start to the backward's (the loss and what the training
      step does before ``backward`` included);
    - ``backward_compute``: the backward pass, to the last gradient ready;
    - ``allreduce``: the gradient AllReduce, from the first bucket's start to the last one's end
      (through the communication hook, if any);
    - ``exposed_comm``: the part of the AllReduce after the last gradient was ready (``allreduce``
      minus its overlap with the backward pass): what communication adds to the step;
    - ``data_wait``: from the end of the previous step to this one's start (fetching the batch);
    - ``optimizer``: from the end of the backward pass to the step's end (``optimizer.step``,
      ``zero_grad``);
    - ``step``: from the step's start to its end (``data_wait`` not included);

    and ``step/slowest_ms``, ``step/fastest_ms``: the ``step`` of the slowest and the fastest rank.

    The first four are DDP's own runtime statistics (``DistributedDataParallel``'s logging data:
    CUDA events on GPUs, the host clock on CPU), which DDP records for its first 10 iterations and
    then every ``log_every_n_steps``-th (set here; one DDP iteration per optimizer step, the
    forward pass that synchronizes gradients); the others come from the host clock, after a CUDA
    synchronize on GPUs, for the same step. A logged window reports the latest step DDP sampled,
    up to ``log_every_n_steps`` steps before it. With gradient accumulation, the DDP parts are
    those of the step's last micro-batch, the one whose gradients are AllReduced. At the end of
    training, global rank 0 merges each rank's averages over the logged windows into ``path``
    (key ``step_anatomy_ms``).

    Costs a few clock reads per step and one ``all_gather`` of 7 numbers per window.

    Args:
        path: the JSON file for the averages (the default config: the run's ``ddp.json``).
        log_every_n_steps: optimizer steps between two logged windows (default None: the
            Trainer's ``log_every_n_steps``).
    """

    def __init__(self, path: str, log_every_n_steps: int | None = None) -> None:
        self.path, self.log_every_n_steps = path, log_every_n_steps
        self._every = 1
        self._iteration = 0  # optimizer steps in this process, as DDP counts its iterations
        self._steps: deque[tuple[int, _HostTimes]] = deque()
        self._previous_end: float | None = None
        self._windows, self._sums = 0, torch.zeros(0)  # the complete windows, and their rows' sum

    @override
    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._every = self.log_every_n_steps or trainer.log_every_n_steps or 1
        self._steps = deque(maxlen=self._every + 2)  # the sampled step is at most _every + 1 steps old
        if isinstance(trainer.strategy.model, torch.nn.parallel.DistributedDataParallel):
            sample_ddp_runtime_every(trainer.strategy.model, self._every)

    @override
    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._previous_end = None  # the first batch of an epoch waits for the loader's start, not a fetch
        if self._steps and math.isnan(self._steps[-1][1].end):
            self._steps.pop()  # the last epoch's accumulation, cut short by its end: no step boundary

    def _sampled(self, iteration: int) -> bool:
        """Whether DDP times this iteration (its rule: the first 10, then every ``_every``-th)."""
        return iteration <= 10 or iteration % self._every == 0

    @override
    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch, batch_idx: int) -> None:
        if self._steps and math.isnan(self._steps[-1][1].end):
            return  # a later micro-batch of the same optimizer step
        now = _clock(pl_module, self._sampled(self._iteration + 1))
        wait = now - self._previous_end if self._previous_end is not None else math.nan
        self._steps.append((self._iteration + 1, _HostTimes(data_wait=wait, start=now)))

    @override
    def on_before_optimizer_step(self, trainer: L.Trainer, pl_module: L.LightningModule, optimizer) -> None:
        if self._steps:
            self._steps[-1][1].before_optimizer = _clock(pl_module, self._sampled(self._steps[-1][0]))

    @override
    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs, batch, batch_idx) -> None:
        if not at_optimizer_step_boundary(trainer, batch_idx) or not self._steps:
            return
        self._iteration += 1
        # The next step's data wait starts here: synchronized when DDP times the next step.
        synchronize = self._sampled(self._iteration) or self._sampled(self._iteration + 1)
        self._previous_end = self._steps[-1][1].end = _clock(pl_module, synchronize)
        if logs_this_step(trainer):
            self._log_window(trainer, pl_module)

    def _log_window(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        local = torch.tensor(self._row(trainer), dtype=torch.float64, device=pl_module.device)
        rows = gather_rows(trainer, pl_module, local).cpu()  # (world_size, 7)
        if not trainer.is_global_zero or rows.isnan().all():
            return
        metrics = {}
        for rank, row in enumerate(rows.tolist()):
            metrics |= {f"step/rank_{rank}/{part}_ms": ms for part, ms in zip(PARTS, row) if not math.isnan(ms)}
        steps = rows[:, PARTS.index("step")]
        if not steps.isnan().any():
            metrics |= {"step/slowest_ms": steps.max().item(), "step/fastest_ms": steps.min().item()}
        log_on_rank_zero(trainer, metrics)
        if not rows.isnan().any():
            self._windows += 1
            self._sums = rows if self._windows == 1 else self._sums + rows

    def _row(self, trainer: L.Trainer) -> list[float]:
        """This rank's parts of the latest step DDP timed (ms, in :data:`PARTS` order); NaN where
        unknown (no DDP wrapper, no sampled step held, the first step of an epoch's data wait)."""
        nan = [math.nan] * len(PARTS)
        model = trainer.strategy.model
        if not isinstance(model, torch.nn.parallel.DistributedDataParallel):
            return nan
        data = ddp_logging_data(model)
        host = dict(self._steps).get(data.get("iteration"))
        if host is None or "backward_comm_time" not in data:
            return nan
        allreduce = data["backward_comm_time"] / 1e6
        exposed = max(0.0, allreduce - data["backward_compute_comm_overlap_time"] / 1e6)
        return [
            data["forward_compute_time"] / 1e6,
            data["backward_compute_time"] / 1e6,
            allreduce,
            exposed,
            host.data_wait * 1e3,
            (host.end - host.before_optimizer) * 1e3,
            (host.end - host.start) * 1e3,
        ]

    @override
    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not trainer.is_global_zero or not self._windows:
            return
        averages = {
            f"rank_{rank}": {part: round(total / self._windows, 3) for part, total in zip(PARTS, sums)}
            for rank, sums in enumerate(self._sums.tolist())
        }
        update_json(Path(self.path), {"step_anatomy_ms": {"windows": self._windows, **averages}})
        log.info(
            f"Step anatomy, rank 0's average over {self._windows} windows (ms): "
            + ", ".join(f"{part} {value:.2f}" for part, value in averages["rank_0"].items())
        )


def _clock(pl_module: L.LightningModule, sampled: bool) -> float:
    """The host clock (:func:`~ddp_engine.callbacks.rank_metrics.clock`), after the GPU's queued work
    on the steps DDP samples (``sampled``): the others' times are not reported."""
    return clock(pl_module.device, sampled and pl_module.device.type == "cuda")
