"""ddp-engine: what makes a PyTorch Lightning run distributed, exact, supervised and resumable, for
any task: the command line and its checks, the supervisor of a job's DDP processes, exact sharding,
evaluation and resume, checkpoints, signals, sweeps, trackers, per-rank reports and ZeRO-1.

A project hands it its task through its configs (the ``task``, ``model`` and ``data`` groups) and
its entry points (:class:`ddp_engine.project.Project`); the engine imports none of the project's code.
"""

__version__ = "0.1.0"
