"""The distributed machinery: the DDP strategy (``conf/strategy``), launching and supervising the
job's processes, the data-parallel layout arithmetic, checkpoint IO, and host memory settings."""
