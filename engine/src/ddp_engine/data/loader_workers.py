"""How the DataLoader workers of a process start: forked from a forkserver of that process, never
from the process itself (:func:`workers_context`, every loader's ``multiprocessing_context``).

A DDP process runs threads (gloo's, the termination watchdog, Lightning's, a tracker's). A child
forked from a process with threads gets every lock in the state the fork found it: a lock another
thread held at that moment stays held in the child, by a thread the child does not have, and a
worker that needs it waits forever, and its process with it, for a batch that never comes. The
workers are forked from a forkserver instead: a fresh interpreter that this process starts (fork
then exec: nothing of this process's state survives) the first time a loader with workers is
built, that imports the modules the workers need once and runs one thread only, so a worker forked
from it inherits no lock held.

What it costs, against forking this process (measured by the template's benchmarks):

- the forkserver's imports (torch and the datasets' modules: :attr:`ShardedDataModule.worker_modules
  <ddp_engine.data.sharded.ShardedDataModule.worker_modules>`), once per process; the engine starts
  it as soon as the DataModule exists (``start_loader_forkserver``), so that they run while the
  model is built and the process group forms. Each worker is a fork of it, which has the modules.
  No worker needs Lightning: :func:`seeded_by_torch` is their ``worker_init_fn``;
- each worker gets the dataset pickled, as with the ``spawn`` start method: its tensors are moved
  into shared memory (``/dev/shm``) once, and a worker maps them rather than copying them, so
  ``/dev/shm`` holds each process's data set (a container's default 64 MiB is too small for two
  processes of a 41 MiB training split). A
  dataset of many tensors passes one file descriptor each, and Python's forkserver passes at most
  about 250 to a worker ("ValueError: too many fds"): hold the samples in a few large tensors
  (:class:`~ddp_engine.data.sharded.GatherDataset`), not in a list of tensors.

How they end: with this process, however it ends, SIGKILL included (see
:mod:`ddp_engine.data.loader_forkserver`). The kernel ends the forkserver when the thread that
started it ends; Lightning builds its loaders in the main thread.
"""

import multiprocessing
import os
from multiprocessing.context import BaseContext

from ddp_engine.core.compat import start_forkserver

#: Set by a process that starts its loaders' forkserver, to its own pid: the forkserver, whose
#: parent it is, ties its life and its workers' to it (:mod:`ddp_engine.data.loader_forkserver`).
LOADER_FORKSERVER_PARENT_ENV = "DDP_ENGINE_LOADER_FORKSERVER_PARENT"
#: The module the forkserver imports first.
FORKSERVER_MODULE = "ddp_engine.data.loader_forkserver"


def workers_context(*modules: str) -> BaseContext:
    """The ``multiprocessing_context`` of a DataLoader with workers: Python's forkserver context,
    its forkserver running (started now the first time, importing :data:`FORKSERVER_MODULE`, then
    ``modules``).

    Args:
        modules: the modules the workers unpickle the dataset from (its class's, the DataModule's),
            imported once in the forkserver. A worker imports what is missing itself, once per
            worker: the module the process runs as ``__main__`` among them, which each runs again
            as ``__mp_main__`` (as any child that is not forked from its parent does), in 0.1 s.
    """
    context = multiprocessing.get_context("forkserver")
    if os.environ.get(LOADER_FORKSERVER_PARENT_ENV) != str(os.getpid()):
        # Once per process, before its first worker: a forkserver reads its imports when it starts.
        os.environ[LOADER_FORKSERVER_PARENT_ENV] = str(os.getpid())
        context.set_forkserver_preload([FORKSERVER_MODULE, *dict.fromkeys(modules)])
    start_forkserver(context)  # here, in the thread that builds the loader, which it ends with
    return context


def seeded_by_torch(worker_id: int) -> None:
    """The ``worker_init_fn`` of the engine's loaders: nothing to do. torch seeds each worker's torch,
    ``random`` and numpy generators from the loader's base seed and ``worker_id``, and the loader's
    generator mixes in the global rank (:class:`~ddp_engine.data.sharded.ShardedDataModule`). Set, it
    keeps Lightning from adding its own, whose module would have every worker import Lightning (seconds)."""
