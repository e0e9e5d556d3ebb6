"""Shared fixtures: synthetic MNIST-format data, the offline real MNIST copy, the CLI runner."""

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

REPO = Path(__file__).resolve().parents[1]


def write_idx(path: Path, array: np.ndarray) -> None:
    """Write a uint8 array in the IDX format of the MNIST files (big-endian header, magic 0x08 0x0N)."""
    header = bytes([0, 0, 0x08, array.ndim]) + b"".join(int(n).to_bytes(4, "big") for n in array.shape)
    path.write_bytes(header + array.astype(np.uint8).tobytes())


def make_synthetic_mnist(
    root: Path, n_train: int = 1200, n_test: int = 300, label_noise: float = 0.0, seed: int = 0
) -> Path:
    """MNIST-shaped IDX files in ``root/MNIST/raw/`` that a CNN learns in a few steps.

    Each image is faint noise plus a bright 6x6 patch whose position encodes its class (0..9),
    so the real loading code runs and a working training loop reaches high accuracy quickly.
    A fraction ``label_noise`` of the labels is replaced by random classes, which keeps the
    accuracy below 100% (so that counting a sample twice would change it).
    """
    rng = np.random.default_rng(seed)
    raw = root / "MNIST" / "raw"
    raw.mkdir(parents=True)
    for prefix, n in (("train", n_train), ("t10k", n_test)):
        labels = rng.integers(0, 10, n)
        images = rng.integers(0, 60, (n, 28, 28))
        for i, label in enumerate(labels):
            r, c = 3 + (label // 5) * 14, 1 + (label % 5) * 5
            # Bright but not flat: identical patches would make exactly tied max-pool inputs, whose
            # argmax (and so the gradient) flips with float rounding, and equivalence checks with it.
            images[i, r : r + 6, c : c + 6] = rng.integers(190, 256, (6, 6))
        noisy = rng.random(n) < label_noise
        labels[noisy] = rng.integers(0, 10, noisy.sum())
        write_idx(raw / f"{prefix}-images-idx3-ubyte", images)
        write_idx(raw / f"{prefix}-labels-idx1-ubyte", labels)
    return root


@pytest.fixture(scope="session")
def synthetic_data_dir(tmp_path_factory) -> Path:
    return make_synthetic_mnist(tmp_path_factory.mktemp("synthetic"))


@pytest.fixture(scope="session")
def mnist_data_dir() -> Path:
    """The real MNIST copy: ``$MNIST_DATA_DIR`` (set by .ci/run), else ``../shared/data`` if present."""
    path = Path(os.environ.get("MNIST_DATA_DIR", REPO.parent / "shared" / "data"))
    if not (path / "MNIST" / "raw" / "train-images-idx3-ubyte").is_file():
        pytest.skip(f"real MNIST not found in {path}/MNIST/raw; set MNIST_DATA_DIR to a folder that has it")
    return path


def cli_command(*overrides: str, log_dir: Path) -> list[str]:
    """``python -m mnist_ddp.train`` with Hydra overrides, writing under ``log_dir``."""
    return [sys.executable, "-m", "mnist_ddp.train", f"paths.log_dir={log_dir}", *overrides]


def cli_env(**extra: str) -> dict[str, str]:
    """The environment for a CLI run: this one, plus tests/ on PYTHONPATH so that a run can load the
    test-only callbacks of ``probes.py`` through Hydra overrides (``+callbacks.x._target_=probes...``)."""
    path = os.pathsep.join(filter(None, [str(REPO / "tests"), os.environ.get("PYTHONPATH")]))
    return {**os.environ, "PYTHONPATH": path, **extra}


def run_cli(
    *overrides: str, log_dir: Path, env: dict | None = None, timeout: float = 600
) -> subprocess.CompletedProcess:
    """Run the training command as a user would, wait for it, and capture its output."""
    command = cli_command(*overrides, log_dir=log_dir)
    return subprocess.run(
        command, cwd=REPO, env=cli_env(**(env or {})), capture_output=True, text=True, timeout=timeout
    )


def read_scalars(event_dir: Path) -> dict[str, list[float]]:
    """Every scalar tag in the TensorBoard event files of ``event_dir``, read with TensorBoard's own reader."""
    events = EventAccumulator(str(event_dir), size_guidance={"scalars": 0})
    events.Reload()
    return {tag: [event.value for event in events.Scalars(tag)] for tag in events.Tags()["scalars"]}
