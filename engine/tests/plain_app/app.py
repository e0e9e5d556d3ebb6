"""A Hydra app that knows nothing of the engine (no ``trainer``, no project, no engine config):
each job records its pid and when it ran in ``job.json`` of its directory, sleeping
``seconds`` between, and fails when ``x`` is ``fail_on``. The engine's launcher runs its sweeps
(``hydra/launcher=resumable``), which any Hydra app finds on the search path once the engine is
installed."""

import json
import os
import time
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig


@hydra.main(config_path=".", config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> float:
    started = time.time()
    time.sleep(cfg.seconds)
    if cfg.x == cfg.fail_on:
        raise RuntimeError(f"job x={cfg.x} fails as asked")
    record = {"x": cfg.x, "pid": os.getpid(), "started": started, "ended": time.time()}
    (Path(HydraConfig.get().runtime.output_dir) / "job.json").write_text(json.dumps(record))
    return float(cfg.x)


if __name__ == "__main__":
    main()
