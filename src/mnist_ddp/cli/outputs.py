"""Files a job writes into its run directory besides Lightning's own."""

import hashlib
import json
import os
from pathlib import Path

from omegaconf import DictConfig, OmegaConf


def write_json(path: Path, data: dict) -> None:
    """Write ``data`` to ``path`` as JSON, atomically: a reader sees the old file or the whole new one."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.partial")
    partial.write_text(json.dumps(data, indent=2) + "\n")
    os.replace(partial, path)


def config_fingerprint(cfg: DictConfig) -> str:
    """First 12 hex digits of the SHA-256 of the resolved config as YAML: equal on every rank of a job."""
    return hashlib.sha256(OmegaConf.to_yaml(cfg, resolve=True).encode()).hexdigest()[:12]
