"""ddp-engine: what makes a PyTorch Lightning run distributed, exact, supervised and resumable, for
any task: the command line and its checks, the supervisor of a job's DDP processes, exact sharding,
evaluation and resume, checkpoints, signals, sweeps, trackers, per-rank reports and ZeRO-1.

A task declares itself in one object (:class:`ddp_engine.api.Task`) and imports the engine from
one public module, :mod:`ddp_engine.api`; the engine imports none of a task's code.
"""

__version__ = "0.1.0"
