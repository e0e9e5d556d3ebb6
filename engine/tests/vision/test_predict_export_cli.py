"""``python -m vision_task.predict`` and ``python -m vision_task.export`` end to end: the image
machinery's prediction and export through the real command lines of the image test task, in
subprocesses, prediction with 2 gloo processes, on the image folder's test images.

Kept cheap: nothing is trained through the command line, the training run they use is made in
process in seconds, as ``vision_task.train`` leaves one (its ``.hydra/config.yaml`` and
``checkpoints/last.ckpt``); the prediction runs at the same time as the export. Reading an IDX file
(gzipped too) as the input: test_predict_export.py.
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
from harness import HERE, cli_command, cli_env, only, ranks_in_log, run_cli
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate
from omegaconf import OmegaConf, open_dict
from torchvision.io import write_png
from vision_task.task import TASK

from ddp_engine.api import register
from ddp_engine.config.schema import register_configs
from ddp_engine.models.build import build_model
from ddp_engine.vision.images import decode_image_file
from ddp_engine.vision.spec import read_data_spec

pytestmark = pytest.mark.processes

#: The run's own model and normalization, both other than the commands' defaults (the MLP, the statistics
#: computed from train/): a command that took its own would fail the checkpoint's check, or predict
#: other probabilities.
RUN_OVERRIDES = ["model=resnet", "data.mean=0.2", "data.std=0.4"]
#: An odd count: the two replicas' shards differ in size (6 and 5).
IMAGES = 11


@pytest.fixture(scope="module")
def run(image_folder, tmp_path_factory) -> Path:
    """A training run's directory, as ``vision_task.train`` leaves one: a ResNet trained 30 steps on the
    image folder in this process."""
    # Registered here too: a module's fixture runs before the test's own (conftest.py's test_task).
    register(TASK)
    register_configs()
    overrides = ["data=folder", f"data.root={image_folder}", f"data.cache_dir={tmp_path_factory.mktemp('cache')}",
                 "data.global_batch_size=32", *RUN_OVERRIDES]  # fmt: skip
    with initialize_config_dir(config_dir=str(TASK.configs()), version_base="1.3"):
        cfg = compose(config_name="config", overrides=overrides, return_hydra_config=True)
    L.seed_everything(0)
    trainer = L.Trainer(accelerator="cpu", devices=1, max_steps=30, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, use_distributed_sampler=False,
                        num_sanity_val_steps=0, limit_val_batches=0)  # fmt: skip
    datamodule = instantiate(cfg.data)
    trainer.fit(build_model(cfg.model, datamodule.spec), datamodule=datamodule)
    run_dir = tmp_path_factory.mktemp("run")
    (run_dir / ".hydra").mkdir()
    # As Hydra saves them, unresolved: its own record (the data option), the job's overrides, its config.
    OmegaConf.save(OmegaConf.create({"hydra": cfg.hydra}), run_dir / ".hydra" / "hydra.yaml")
    OmegaConf.save(OmegaConf.create(overrides), run_dir / ".hydra" / "overrides.yaml")
    with open_dict(cfg):
        del cfg["hydra"]
    OmegaConf.save(cfg, run_dir / ".hydra" / "config.yaml")
    trainer.save_checkpoint(run_dir / "checkpoints" / "last.ckpt")
    return run_dir


@pytest.fixture(scope="module")
def test_pixels(image_folder) -> torch.Tensor:
    """The image folder's first 64 test images (by path), ``(64, 3, 32, 32)`` uint8."""
    return torch.stack([decode_image_file(path) for path in sorted((image_folder / "test").rglob("*.png"))[:64]])


def reference(run: Path, pixels: torch.Tensor) -> tuple[list[int], list[float]]:
    """The classes and their probabilities of the run's checkpoint on ``pixels``, in this process."""
    cfg = OmegaConf.load(run / ".hydra" / "config.yaml")
    spec = read_data_spec(run / "checkpoints" / "last.ckpt")  # the folder's shape, with the run's own statistics
    assert (spec.mean, spec.std) == ((0.2,) * 3, (0.4,) * 3)
    model = build_model(cfg.model, spec)
    model.load_state_dict(torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"])
    with torch.no_grad():
        probabilities, classes = model.eval()(spec.normalize(pixels)).softmax(dim=1).max(dim=1)
    return classes.tolist(), probabilities.tolist()


def class_names(run: Path) -> tuple[str, ...]:
    return read_data_spec(run / "checkpoints" / "last.ckpt").class_names


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
def commands(run, test_pixels, image_folder, tmp_path_factory) -> Commands:
    """``python -m vision_task.predict`` with 2 processes on a folder of PNGs, and
    ``python -m vision_task.export format=onnx``, started together: they share only the checkpoint,
    and on 2 cores the one's single-process phases (start-up, checks) fill the other's."""
    root = tmp_path_factory.mktemp("commands")
    # A folder of 11 PNGs, some in a subfolder.
    names = [f"{'sub/' if index % 3 == 0 else ''}image_{index:02d}.png" for index in range(IMAGES)]
    for name, image in zip(names, test_pixels):
        (root / "pngs" / name).parent.mkdir(parents=True, exist_ok=True)
        write_png(image, str(root / "pngs" / name))
    checkpoint = f"ckpt_path={run / 'checkpoints' / 'last.ckpt'}"
    export_command = (checkpoint, f"data.root={image_folder}", "format=onnx")
    command_lines = {
        "predict": ("trainer.accelerator=cpu", "trainer.devices=2", checkpoint, f"input={root / 'pngs'}"),
        "export": export_command,
    }
    started = [
        subprocess.Popen(
            cli_command(f"vision_task.{name}", *overrides, log_dir=root / name),
            cwd=HERE,
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


def check_rows(
    rows: list[dict], names: list[str], expected: tuple[list[int], list[float]], classes_named: tuple[str, ...]
) -> None:
    # One row per input, none twice, in input order; the classes and probabilities of the checkpoint.
    assert [row["input"] for row in rows] == names
    classes, probabilities = expected
    assert [int(row["class_index"]) for row in rows] == classes
    assert [row["class_name"] for row in rows] == [classes_named[index] for index in classes]
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
    check_rows(rows, [commands.png_names[index] for index in order], reference(run, test_pixels[order]),
               class_names(run))  # fmt: skip


def test_export_to_onnx_writes_a_checked_file_and_refuses_to_overwrite_it(commands, run, test_pixels):
    result = commands.export
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    exported = run / "checkpoints" / "last.onnx"  # beside the checkpoint, named after it
    metrics = json.loads((only(commands.root / "export" / "exports") / "metrics.json").read_text())
    assert metrics["output"] == str(exported) and metrics["max_abs_difference"] <= 1e-5
    assert metrics["check_images"] == 64
    # What the docs promise: raw uint8 pixels in, the run's normalization inside, logits out.
    session = onnxruntime.InferenceSession(str(exported), providers=["CPUExecutionProvider"])
    (logits,) = session.run(["logits"], {"images": test_pixels[:5].numpy()})
    classes, _ = reference(run, test_pixels[:5])
    assert logits.shape == (5, 5) and np.argmax(logits, axis=1).tolist() == classes
    content = exported.read_bytes()

    again = commands.root / "again"
    result = run_cli("vision_task.export", *commands.export_command, log_dir=again)
    assert result.returncode == 1
    assert result.stderr.startswith(f"Error: output={exported} exists, and an export never overwrites a file."), (
        result.stderr[-3000:]
    )
    assert exported.read_bytes() == content and not again.exists()


def test_an_export_ends_with_the_files_its_process_wrote(run, image_folder, tmp_path):
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
        cli_command("vision_task.export", f"ckpt_path={run / 'checkpoints' / 'last.ckpt'}", f"data.root={image_folder}",
                    "format=torch_export", f"output={output}", log_dir=tmp_path / "logs"),
        cwd=HERE, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert output.is_file()
    assert written.read_text() == "written at exit\n"
