"""``python -m mnist_ddp.predict`` and ``python -m mnist_ddp.export`` end to end: the real command
lines in subprocesses, prediction with 2 gloo processes, on real MNIST test images.

Kept cheap (the file takes about a minute on 2 cores): nothing is trained through the command
line, the training run they use is made in process in seconds, as ``mnist_ddp.train`` leaves one
(its ``.hydra/config.yaml`` and ``checkpoints/last.ckpt``); the prediction runs at the same time as
the export. Reading an IDX file (gzipped too) as the input: run/test_predict_export.py.
"""

import csv
import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

import lightning as L
import numpy as np
import onnxruntime
import pytest
import torch
from ddp_engine.config.schema import register_configs
from ddp_engine.models.build import build_model
from ddp_engine.vision.idx import IMAGES_KIND, MNIST_FILES, read_idx_file
from ddp_engine.vision.spec import read_data_spec
from harness import only, ranks_in_log
from helpers import CONFIG_DIR, IDX_DATA, REPO, cli_command, cli_env, run_cli
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate
from omegaconf import OmegaConf
from torchvision.io import write_png

pytestmark = pytest.mark.processes

#: The run's own model and normalization, both other than the commands' defaults (CNN, 0.1307 / 0.3081):
#: a command that took its own would fail the checkpoint's check, or predict other probabilities.
RUN_OVERRIDES = ["model=mlp", "data.mean=0.2", "data.std=0.4"]
#: An odd count: the two replicas' shards differ in size (6 and 5).
IMAGES = 11


@pytest.fixture(scope="module")
def run(mnist_data_dir, tmp_path_factory) -> Path:
    """A training run's directory: an MLP trained 30 steps on real MNIST in this process."""
    register_configs()
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        cfg = compose(config_name="config", overrides=[IDX_DATA, f"data.data_dir={mnist_data_dir}", *RUN_OVERRIDES])
    L.seed_everything(0)
    trainer = L.Trainer(accelerator="cpu", devices=1, max_steps=30, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, use_distributed_sampler=False,
                        num_sanity_val_steps=0, limit_val_batches=0)  # fmt: skip
    datamodule = instantiate(cfg.data)
    trainer.fit(build_model(cfg.model, datamodule.spec), datamodule=datamodule)
    run_dir = tmp_path_factory.mktemp("run")
    (run_dir / ".hydra").mkdir()
    OmegaConf.save(cfg, run_dir / ".hydra" / "config.yaml")  # as Hydra saves it: unresolved
    trainer.save_checkpoint(run_dir / "checkpoints" / "last.ckpt")
    return run_dir


@pytest.fixture(scope="module")
def test_pixels(mnist_data_dir) -> torch.Tensor:
    """The first 64 real MNIST test images, ``(64, 28, 28)`` uint8."""
    return read_idx_file(mnist_data_dir / "MNIST" / "raw" / MNIST_FILES["test_images"], 3, IMAGES_KIND)[:64]


def reference(run: Path, pixels: torch.Tensor) -> tuple[list[int], list[float]]:
    """The classes and their probabilities of the run's checkpoint on ``pixels``, in this process."""
    cfg = OmegaConf.load(run / ".hydra" / "config.yaml")
    spec = read_data_spec(run / "checkpoints" / "last.ckpt")  # the run's MNIST shape, with its own statistics
    assert (spec.mean, spec.std) == ((0.2,), (0.4,))
    model = build_model(cfg.model, spec)
    model.load_state_dict(torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"])
    with torch.no_grad():
        probabilities, classes = model.eval()(spec.normalize(pixels.unsqueeze(1))).softmax(dim=1).max(dim=1)
    return classes.tolist(), probabilities.tolist()


@dataclass
class Commands:
    """What the fixture :func:`commands` ran: each command's result, and where."""

    predict: subprocess.CompletedProcess
    export: subprocess.CompletedProcess
    #: The input: a folder of PNGs.
    input: Path
    #: The names of the PNGs by their index in ``test_pixels``.
    png_names: list[str]
    #: The folder with the inputs and each command's ``paths.log_dir`` (``predict/``, ``export/``).
    root: Path
    #: The export's overrides, for running it again.
    export_command: tuple[str, ...]


@pytest.fixture(scope="module")
def commands(run, test_pixels, mnist_data_dir, tmp_path_factory) -> Commands:
    """``python -m mnist_ddp.predict`` with 2 processes on a folder of PNGs, and
    ``python -m mnist_ddp.export format=onnx``, started together: they share only the checkpoint,
    and on 2 cores the one's single-process phases (start-up, checks) fill the other's."""
    root = tmp_path_factory.mktemp("commands")
    # A folder of 11 PNGs, some in a subfolder.
    names = [f"{'sub/' if index % 3 == 0 else ''}digit_{index:02d}.png" for index in range(IMAGES)]
    for name, image in zip(names, test_pixels):
        (root / "pngs" / name).parent.mkdir(parents=True, exist_ok=True)
        write_png(image.unsqueeze(0), str(root / "pngs" / name))
    checkpoint = f"ckpt_path={run / 'checkpoints' / 'last.ckpt'}"
    export_command = (checkpoint, f"data.data_dir={mnist_data_dir}", "format=onnx")
    command_lines = {
        "predict": ("trainer.accelerator=cpu", "trainer.devices=2", checkpoint, f"input={root / 'pngs'}"),
        "export": export_command,
    }
    started = [
        subprocess.Popen(
            cli_command(*overrides, log_dir=root / name, module=f"mnist_ddp.{name}"),
            cwd=REPO,
            env=cli_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for name, overrides in command_lines.items()
    ]
    # communicate() reads both pipes to the end, so that neither command blocks on a full one.
    outputs = [process.communicate(timeout=600) for process in started]
    predict, export = (
        subprocess.CompletedProcess(process.args, process.returncode, *output)
        for process, output in zip(started, outputs)
    )
    return Commands(predict, export, root / "pngs", names, root, export_command)


def check_rows(rows: list[dict], names: list[str], expected: tuple[list[int], list[float]]) -> None:
    # One row per input, none twice, in input order; the classes and probabilities of the checkpoint.
    assert [row["input"] for row in rows] == names
    classes, probabilities = expected
    assert [int(row["class_index"]) for row in rows] == classes
    assert [row["class_name"] for row in rows] == [str(index) for index in classes]
    assert [float(row["probability"]) for row in rows] == pytest.approx(probabilities, abs=1e-6)
    assert all(0 < float(row["probability"]) <= 1 for row in rows)


def test_predict_with_two_processes_gives_each_input_one_row_in_order(commands, run, test_pixels):
    result = commands.predict
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    run_dir = only(commands.root / "predict" / "predictions")
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert metrics["input"] == str(commands.input) and metrics["world_size"] == 2 and metrics["inputs"] == IMAGES
    assert ranks_in_log(run_dir, "predict") == {0, 1}
    with open(run_dir / "predictions.csv", newline="") as file:
        rows = list(csv.DictReader(file))
    # The folder's rows by the files' paths, sorted (subfolder last).
    order = sorted(range(IMAGES), key=lambda index: commands.png_names[index])
    check_rows(rows, [commands.png_names[index] for index in order], reference(run, test_pixels[order]))


def test_export_to_onnx_writes_a_checked_file_and_refuses_to_overwrite_it(commands, run, test_pixels):
    result = commands.export
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    exported = run / "checkpoints" / "last.onnx"  # beside the checkpoint, named after it
    metrics = json.loads((only(commands.root / "export" / "exports") / "metrics.json").read_text())
    assert metrics["output"] == str(exported) and metrics["max_abs_difference"] <= 1e-5
    assert metrics["check_images"] == 64
    # What the docs promise: raw uint8 pixels in, the run's normalization inside, logits out.
    session = onnxruntime.InferenceSession(str(exported), providers=["CPUExecutionProvider"])
    (logits,) = session.run(["logits"], {"images": test_pixels[:5].unsqueeze(1).numpy()})
    classes, _ = reference(run, test_pixels[:5])
    assert logits.shape == (5, 10) and np.argmax(logits, axis=1).tolist() == classes
    content = exported.read_bytes()

    again = commands.root / "again"
    result = run_cli(*commands.export_command, log_dir=again, module="mnist_ddp.export")
    assert result.returncode == 1
    assert result.stderr.startswith(f"Error: output={exported} exists, and an export never overwrites a file."), (
        result.stderr[-3000:]
    )
    assert exported.read_bytes() == content and not again.exists()


def test_an_export_ends_with_the_files_its_process_wrote(run, mnist_data_dir, tmp_path):
    """An export runs in the command's own process, which ends through the normal exit: a file an
    object of that process still buffers (never flushed or closed: the interpreter's teardown
    finalizes it) is written. A ``sitecustomize`` module, which Python imports at start-up, holds one."""
    probe, written = tmp_path / "probe", tmp_path / "buffered.txt"
    probe.mkdir()
    (probe / "sitecustomize.py").write_text(
        "import os\n_file = open(os.environ['BUFFERED_PROBE'], 'w')\n_file.write('written at exit\\n')\n"
    )
    output = tmp_path / "model.pt2"
    env = cli_env(BUFFERED_PROBE=str(written))
    env["PYTHONPATH"] = f"{probe}{os.pathsep}{env['PYTHONPATH']}"
    result = subprocess.run(
        cli_command(f"ckpt_path={run / 'checkpoints' / 'last.ckpt'}", f"data.data_dir={mnist_data_dir}",
                    "format=torch_export", f"output={output}", log_dir=tmp_path / "logs", module="mnist_ddp.export"),
        cwd=REPO, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert output.is_file()
    assert written.read_text() == "written at exit\n"
