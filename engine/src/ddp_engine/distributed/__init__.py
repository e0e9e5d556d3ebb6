"""Data parallelism: the DDP strategy (``ddp_engine/conf/strategy``), the layout arithmetic (world size,
per-device batch size), checkpoint IO, and what a failed process group tells."""
