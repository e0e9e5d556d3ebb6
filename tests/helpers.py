"""Helpers the tests share: the synthetic data sets, the command-line runners (``run_cli``,
``torchrun``, a simulated SLURM), readers of what a run leaves (TensorBoard scalars, rank tags,
live processes) and the deterministic configuration of the equivalence runs.

Test modules import them with ``from helpers import ...``; the fixtures built on them are in
conftest.py (pytest finds those by name, a module never imports conftest).
"""

import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import harness
import lightning as L
import numpy as np
from ddp_engine.models.build import build_model
from ddp_engine.vision.idx import MNIST_FILES
from harness import override_keys
from hydra.utils import instantiate

from mnist_ddp.task import TASK

REPO = Path(__file__).resolve().parents[1]
#: The task's configs (conf/), as its commands read them.
CONFIG_DIR = TASK.configs()


def dependencies_pth() -> str:
    """A ``.pth`` file's lines that give a new environment this one's packages as plain paths: every
    site-packages folder on this interpreter's path (its own, and those its ``.pth`` files add, as a
    test's nested environment has), but not the ``.pth`` files inside them (editable installs)."""
    return "".join(f"{path}\n" for path in sys.path if Path(path).name == "site-packages")


def write_idx(path: Path, array: np.ndarray) -> None:
    """Write a uint8 array in the IDX format of the MNIST files (big-endian header, magic 0x08 0x0N)."""
    header = bytes([0, 0, 0x08, array.ndim]) + b"".join(int(n).to_bytes(4, "big") for n in array.shape)
    path.write_bytes(header + array.astype(np.uint8).tobytes())


def make_synthetic_mnist(
    root: Path,
    n_train: int = 1200,
    n_test: int = 300,
    label_noise: float = 0.0,
    test_label_noise: float | None = None,
    seed: int = 0,
) -> Path:
    """MNIST-shaped IDX files in ``root/MNIST/raw/`` that a CNN learns in a few steps.

    Each image is faint noise plus a bright 6x6 patch whose position encodes its class (0..9),
    so the real loading code runs and a working training loop reaches high accuracy quickly.
    A fraction ``label_noise`` of the labels is replaced by random classes, which keeps the
    accuracy below 100% (so that counting a sample twice would change it); ``test_label_noise``,
    if given, is the fraction for the test split instead.
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
        noisy = rng.random(n) < (label_noise if prefix == "train" or test_label_noise is None else test_label_noise)
        labels[noisy] = rng.integers(0, 10, noisy.sum())
        write_idx(raw / f"{prefix}-images-idx3-ubyte", images)
        write_idx(raw / f"{prefix}-labels-idx1-ubyte", labels)
    return root


#: The colours of the synthetic folder data set's classes (RGB), one class each.
COLOURS = {"red": (230, 40, 40), "green": (40, 210, 60), "blue": (50, 70, 230), "yellow": (230, 220, 50),
           "magenta": (220, 50, 210)}  # fmt: skip


def make_image_folder(
    root: Path,
    counts: dict[str, int] | None = None,
    size: tuple[int, int] = (32, 32),
    label_noise: float = 0.0,
    seed: int = 0,
) -> Path:
    """A folder data set of RGB PNGs (``root/<split>/<class>/<n>.png``) that a CNN learns in a few steps.

    Each image is dark noise plus a 9x9 patch of its class's colour (:data:`COLOURS`: five classes,
    not ten) at a random place, so that a random crop or a flip keeps its class. ``counts``: images
    per class of each split (default 48 for ``train``, 14 for ``test``). A fraction ``label_noise``
    of each split's images is put into another class's folder, which keeps the accuracy below 100%
    (so that counting a sample twice would change it). Returns ``root``.
    """
    from PIL import Image

    rng = np.random.default_rng(seed)
    names = list(COLOURS)
    for split, per_class in (counts or {"train": 48, "test": 14}).items():
        for index in range(per_class * len(names)):
            label = index % len(names)
            pixels = rng.integers(0, 50, (*size, 3))
            top, left = rng.integers(0, size[0] - 9), rng.integers(0, size[1] - 9)
            pixels[top : top + 9, left : left + 9] = np.clip(COLOURS[names[label]] + rng.integers(-25, 26, 3), 0, 255)
            folder = names[rng.integers(len(names))] if rng.random() < label_noise else names[label]
            (root / split / folder).mkdir(parents=True, exist_ok=True)
            Image.fromarray(pixels.astype(np.uint8), "RGB").save(root / split / folder / f"{split}{index:04d}.png")
    return root


#: The data option of the tests that read IDX files (the synthetic ones, the real MNIST), chosen on
#: every command line that sets its keys: a project whose ``conf/config.yaml`` defaults to a data set
#: of its own passes the same tests.
IDX_DATA = "data=mnist"
#: The template's network, chosen on the command lines of the tests of it (with the data option).
TEMPLATE_TASK = ("model=cnn",)


# The deterministic configuration of the equivalence and resume checks: no dropout, SGD with
# momentum and a one-cycle schedule (optimizer and schedule state that resuming must restore),
# 2 epochs of 21 global batches of 48 over 1,199 - 191 = 1,008 training images, which divide by
# 1, 2, 3 and 4 processes alike. Validation 191 and test 301 images divide by neither 2 nor 3;
# 25% of the labels are noise, so accuracy stays below 1 and double counting would show.
TRAIN_SIZE, VAL_SIZE, TEST_SIZE, GLOBAL_BATCH, LR = 1008, 191, 301, 48, 0.05


DETERMINISTIC = (
    IDX_DATA, *TEMPLATE_TASK, "trainer.accelerator=cpu", "trainer.max_epochs=2", f"data.val_size={VAL_SIZE}",
    f"data.global_batch_size={GLOBAL_BATCH}", "model.net.dropout=0", "model.optimizer._target_=torch.optim.SGD",
    f"model.optimizer.lr={LR}", "+model.optimizer.momentum=0.9",
    "+callbacks.recorder._target_=probes.SampleRecorder", "+callbacks.recorder.out_dir=${paths.output_dir}/samples",
)  # fmt: skip


def cli_command(*overrides: str, log_dir: Path, module: str = "mnist_ddp.train") -> list[str]:
    """:func:`harness.cli_command` of ``python -m mnist_ddp.train`` (or ``module``); a training that
    resumes no run in place gets :data:`IDX_DATA` and :data:`TEMPLATE_TASK`, each where it chooses
    no option of that group itself."""
    if module == "mnist_ddp.train" and "hydra.run.dir" not in override_keys(overrides):
        overrides = with_template_task(overrides)
    return harness.cli_command(module, *overrides, log_dir=log_dir)


def with_template_task(overrides: Sequence[str]) -> list[str]:
    """``overrides`` after :data:`IDX_DATA` and :data:`TEMPLATE_TASK`, each where ``overrides`` choose
    no option of its group (Hydra refuses two choices of one group)."""
    keys = override_keys(overrides)
    return [*(choice for choice in (IDX_DATA, *TEMPLATE_TASK) if choice.split("=")[0] not in keys), *overrides]


def cli_env(**extra: str) -> dict[str, str]:
    """:func:`harness.cli_env` with tests/ on PYTHONPATH too, for the test-only DataModules of
    ``custom_datamodules.py`` that commands load through Hydra overrides."""
    return harness.cli_env(REPO / "tests", **extra)


def run_cli(
    *overrides: str, log_dir: Path, module: str = "mnist_ddp.train", env: dict | None = None, timeout: float = 600
) -> subprocess.CompletedProcess:
    """Run a command as a user would (training by default), wait for it, and capture its output."""
    command = cli_command(*overrides, log_dir=log_dir, module=module)
    return subprocess.run(
        command, cwd=REPO, env=cli_env(**(env or {})), capture_output=True, text=True, timeout=timeout
    )


def fit_and_test_in_process(cfg, root_dir: Path, max_epochs: int = 3) -> tuple:
    """Build ``cfg``'s model and DataModule as the entry point does (Hydra ``instantiate``), train
    them in this process (one CPU device, no logger or checkpoints) and test them: returns the
    DataModule and the test metrics. For checks of a config's parts; DDP runs go through the CLI."""
    L.seed_everything(0)
    datamodule = instantiate(cfg.data)
    model = build_model(cfg.model, datamodule.spec)
    trainer = L.Trainer(
        accelerator="cpu", devices=1, max_epochs=max_epochs, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, use_distributed_sampler=False,
        default_root_dir=root_dir,
    )  # fmt: skip
    trainer.fit(model, datamodule=datamodule)
    (test,) = trainer.test(model, datamodule=datamodule, verbose=False)
    return datamodule, test


def torchrun(*torchrun_args: str, overrides: tuple[str, ...], log_dir, timeout: float = 600):
    """:func:`harness.torchrun` of the training, with :func:`cli_command`'s choices of data and network."""
    overrides = overrides if "hydra.run.dir" in override_keys(overrides) else with_template_task(overrides)
    return harness.torchrun("mnist_ddp.train", *torchrun_args, overrides=overrides, log_dir=log_dir, env=cli_env(),
                            timeout=timeout)  # fmt: skip


def simulated_slurm(bin_dir: Path, job_id: str, ntasks: int) -> dict[str, str]:
    """:func:`harness.simulated_slurm` with :func:`cli_env`."""
    return harness.simulated_slurm(bin_dir, job_id, ntasks, env=cli_env())


def assert_synthetic_files_in_place(data_dir: Path, synthetic_data_dir: Path) -> None:
    raw = data_dir / "MNIST" / "raw"
    assert sorted(os.listdir(raw)) == sorted(MNIST_FILES.values())
    for name in MNIST_FILES.values():
        assert (raw / name).read_bytes() == (synthetic_data_dir / "MNIST" / "raw" / name).read_bytes()
    assert os.listdir(data_dir / "MNIST") == ["raw"], "the temporary download folder must be gone"


def copy_data(synthetic_data_dir: Path, folder: Path) -> Path:
    """A copy of the synthetic data set (1,200 training and 300 test images); returns its raw/ folder."""
    shutil.copytree(synthetic_data_dir, folder)
    return folder / "MNIST" / "raw"
