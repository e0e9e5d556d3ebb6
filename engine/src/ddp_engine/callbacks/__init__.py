"""The engine's Lightning callbacks (``ddp_engine/conf/callbacks``): the run's summary, throughput, the DDP settings
report, per-rank step costs and memory, the objective's check, exact resume, and stopping on signals."""
