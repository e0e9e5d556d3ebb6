"""A DDP process's conditions when its DataLoader workers start, in a process of their own, for
engine/tests/data/test_loader_workers.py: threads (gloo's, the engine's termination watchdog, one that
allocates in a loop, one that holds a lock the dataset needs), the engine's loaders with 2
workers each, and a resume inside an epoch.

:func:`main` (engine/tests on PYTHONPATH, as ``harness.cli_env`` gives it) prints one JSON line per
phase, then waits to be killed:

1. ``{"phase": "engine", ...}``: the training loader of a :class:`LockedDataModule` resumed at
   :data:`RESUME_AT` samples of epoch :data:`EPOCH`, then its validation loader, as the engine
   builds them (their workers started from the loaders' forkserver): the batches they delivered,
   or the error; the threads that ran; the process tree under this process, with the loaders alive.
2. ``{"phase": "fork", ...}``: the same loaders with the workers forked from this process, as
   the workers of a DDP process started before (``multiprocessing_context="fork"``).
3. ``{"phase": "ready"}``: phase 2's workers are gone, the allocating and the holding threads
   have stopped; phase 1's loaders and their processes are alive.

Each worker that takes a batch needs :data:`HELD`, which a thread of this process holds from
before the loaders are built until their last batch: a worker forked from this process gets the
lock held, by a thread it does not have, and fails after :data:`WAIT_S` seconds (it would wait
forever without the timeout, as the workers of the hang waited for a lock of a library), while a
worker forked from the forkserver has its own.
"""

import gc
import json
import multiprocessing
import os
import signal
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import torch
import torch.distributed as dist
from typing_extensions import override

from ddp_engine.data import sharded
from ddp_engine.data.sharded import GatherDataset, ShardedDataModule
from ddp_engine.launch.worker import TerminationWatchdog

#: Held by a thread of this process while the loaders' workers start and serve.
HELD = threading.Lock()
#: Seconds a worker waits for :data:`HELD` before it fails.
WAIT_S = 2.0
#: The train split's samples (each sample's value is its index), the global batch, the layout.
SAMPLES, GLOBAL_BATCH, WORLD_SIZE, RANK, SHUFFLE_SEED = 96, 8, 2, 1, 7
#: The checkpoint's training position: global samples of epoch EPOCH already trained.
EPOCH, RESUME_AT = 1, 40
#: The validation split's samples, after the train split's.
VAL_SAMPLES = 12


class LockedDataset(GatherDataset):
    """A :class:`GatherDataset` whose batches are served only by a process that can take :data:`HELD`."""

    @override
    def __getitems__(self, indices: list[int]) -> tuple[torch.Tensor, ...]:
        if not HELD.acquire(timeout=WAIT_S):
            raise RuntimeError(f"worker {os.getpid()} waited {WAIT_S:g} s for a lock that no thread of it holds")
        HELD.release()
        return super().__getitems__(indices)


class LockedDataModule(ShardedDataModule):
    """:data:`SAMPLES` training and :data:`VAL_SAMPLES` validation samples of :class:`LockedDataset`,
    each sample's value its index in ``range(SAMPLES + VAL_SAMPLES)``."""

    @override
    def setup(self, stage: str) -> None:
        values = torch.arange(SAMPLES + VAL_SAMPLES)
        self.train_set = LockedDataset(values[:SAMPLES].unsqueeze(1), values[:SAMPLES])
        self.val_set = LockedDataset(values[SAMPLES:].unsqueeze(1), values[SAMPLES:])


def descendants(root: int) -> list[dict]:
    """Every process under ``root`` (children, their children, ...) from /proc: pid, ppid, title."""
    parents, titles = {}, {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            titles[int(stat.parent.name)] = (stat.parent / "cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
        except (OSError, IndexError):
            continue
        if fields[0] != "Z":
            parents[int(stat.parent.name)] = int(fields[1])
    found, frontier = [], [root]
    while frontier:
        parent = frontier.pop()
        children = [pid for pid, ppid in parents.items() if ppid == parent]
        found += [{"pid": pid, "ppid": parent, "title": titles[pid]} for pid in children]
        frontier += children
    return sorted(found, key=lambda process: process["pid"])


def load(datamodule: LockedDataModule) -> dict:
    """The resumed training loader's batches, then the validation loader's (each batch: its
    samples' values), or the error that ended them; the loaders are kept in ``loaders``."""
    datamodule.load_state_dict(
        {"train_position": {"epoch": EPOCH, "samples": RESUME_AT, "global_batch_size": GLOBAL_BATCH}}
    )
    batches, loaders = {"train": [], "val": []}, []
    try:
        loaders.append(datamodule.train_dataloader())
        batches["train"] = [labels.tolist() for _, labels in loaders[-1]]
        loaders.append(datamodule.val_dataloader())
        batches["val"] = [labels.tolist() for _, labels in loaders[-1]]
    except RuntimeError as error:
        return {**batches, "error": str(error), "loaders": loaders}
    return {**batches, "error": None, "loaders": loaders}


def allocate(stop: threading.Event) -> None:
    """Allocate and free in a loop, as the threads of a DDP process do."""
    while not stop.is_set():
        torch.empty(1 << 16).fill_(1.0)
        bytearray(1 << 16)


def report(line: dict) -> None:
    print(json.dumps(line), flush=True)


def main() -> None:
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)  # gloo's threads
    TerminationWatchdog(grace=60.0)
    stop = threading.Event()
    threading.Thread(target=allocate, args=(stop,), name="allocate", daemon=True).start()
    held, done = threading.Event(), threading.Event()

    def hold() -> None:
        with HELD:
            held.set()
            done.wait()

    threading.Thread(target=hold, name="hold", daemon=True).start()
    held.wait()
    threads = len(os.listdir("/proc/self/task"))

    datamodule = LockedDataModule(GLOBAL_BATCH, num_workers=2, shuffle_seed=SHUFFLE_SEED)
    datamodule.trainer = SimpleNamespace(world_size=WORLD_SIZE, global_rank=RANK, accumulate_grad_batches=1)
    datamodule.setup("fit")
    started = time.perf_counter()
    engine = load(datamodule)
    seconds = time.perf_counter() - started
    report({"phase": "engine", "pid": os.getpid(), "native_threads": threads, "seconds": seconds,
            **{key: value for key, value in engine.items() if key != "loaders"},
            "processes": descendants(os.getpid())})  # fmt: skip

    # The same loaders, with the workers forked from this process.
    sharded.workers_context = lambda *modules: multiprocessing.get_context("fork")
    started = time.perf_counter()
    forked = load(datamodule)
    seconds = time.perf_counter() - started
    # Its workers are this process's children with its command line, ended here: a loader's
    # shutdown of workers forked so took its join's timeout, 5 s, for each. torch's SIGCHLD
    # handler, which would raise for them, is put aside first.
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    title = Path("/proc/self/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
    for process in descendants(os.getpid()):
        if process["ppid"] == os.getpid() and process["title"] == title:
            os.kill(process["pid"], signal.SIGKILL)
    forked.pop("loaders")
    gc.collect()  # only phase 1's processes stay
    report({"phase": "fork", "seconds": seconds, **forked})
    done.set()
    stop.set()
    report({"phase": "ready"})
    sys.stdin.read()  # until the test kills this process or closes its stdin
