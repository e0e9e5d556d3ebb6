"""How the jobs of a sweep share one machine: each job running at a time gets GPUs or CPU cores of its
own, which no other running job gets (:mod:`ddp_engine.launch.parallel_jobs` runs them)."""

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Slot:
    """The part of the machine one job runs on.

    Attributes:
        gpus: the GPUs it sees (its ``CUDA_VISIBLE_DEVICES``: indices or UUIDs as this process sees
            them); empty on CPU.
        cores: the CPU cores its processes are pinned to (``sched_setaffinity``); empty on GPUs.
        threads: on CPU, torch's threads per process (``OMP_NUM_THREADS``): its cores over its
            processes. A GPU job keeps the command's own setting.
    """

    gpus: tuple[str, ...] = ()
    cores: tuple[int, ...] = ()
    threads: int = 1

    def environment(self) -> dict[str, str]:
        """The environment variables that confine the job to this slot."""
        if self.gpus:
            return {"CUDA_VISIBLE_DEVICES": ",".join(self.gpus)}
        return {"OMP_NUM_THREADS": str(self.threads)}


class DevicePool:
    """The GPUs (or CPU cores) of this machine that a sweep's jobs take and give back.

    Args:
        devices: the GPU names (``CUDA_VISIBLE_DEVICES`` entries) or CPU core numbers, in order.
    """

    def __init__(self, devices: Sequence) -> None:
        self.order = list(devices)
        self.free = list(devices)

    def take(self, count: int) -> tuple | None:
        """The first ``count`` free devices, now taken; None when fewer are free."""
        if count > len(self.free):
            return None
        taken, self.free = tuple(self.free[:count]), self.free[count:]
        return taken

    def give_back(self, devices: Sequence) -> None:
        """Return ``devices`` (taken before) to the pool."""
        self.free = [device for device in self.order if device in self.free or device in devices]


def visible_gpus(count: int) -> list[str]:
    """The names of this process's ``count`` visible GPUs as a child's ``CUDA_VISIBLE_DEVICES``
    takes them: this process's own ``CUDA_VISIBLE_DEVICES`` entries, else ``0 .. count - 1``."""
    given = os.environ.get("CUDA_VISIBLE_DEVICES")
    names = [name.strip() for name in given.split(",") if name.strip()] if given else []
    return names[:count] if names else [str(index) for index in range(count)]


def jobs_at_a_time(n_jobs: int | None, devices: int, per_job: int) -> int:
    """How many jobs run at once: ``n_jobs`` when given, else as many as the machine holds,
    ``floor(devices / per_job)`` (``per_job``: the GPUs, or on CPU the processes, of one job); at
    least 1, and never more jobs than ``devices`` can each give one device."""
    fits = max(1, math.floor(devices / max(1, per_job)))
    return max(1, min(n_jobs if n_jobs is not None else fits, devices))


def cpu_slot_size(cores: int, at_a_time: int) -> int:
    """The CPU cores of each job when ``at_a_time`` jobs share ``cores``: an equal share, at least one."""
    return max(1, cores // at_a_time)
