"""The image task's figures as each tracker shows them, on real two-process runs of the image test
task (``python -m vision_task.train``): TensorBoard's Images tab, asked through a real
``tensorboard`` server's HTTP API, shows an input batch, the confusion matrix and every
misclassified test image; the offline W&B run holds the same images; an evaluation draws the
training's test figures again, pixel for pixel; and the figures leave train and eval by
configuration.

The data set is conftest's ``image_folder``: 240 training PNGs (216 after 24 are held out for
validation, 108 per rank in micro-batches of 32) and 70 test PNGs, 5% of the labels wrong, so
that a few test images come out misclassified.
"""

import io
import json
import re
import struct
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
import torch
from harness import only, run_cli
from PIL import Image
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from wandb.proto import wandb_internal_pb2

from ddp_engine.loggers.media import figure_pixels
from ddp_engine.vision.figures import image_grid

pytestmark = pytest.mark.processes

RUN = ("trainer.accelerator=cpu", "trainer.devices=2", "data.global_batch_size=64")
TEST_SIZE = 70
FIGURES = {"train/input_batch", "test/confusion_matrix", "test/misclassified"}
NO_FIGURES = ("~task.callbacks.misclassified", "~task.callbacks.input_batch")


@pytest.fixture(scope="module")
def tracked(image_folder, tmp_path_factory):
    """One finished 2-epoch run on 2 processes, logged to TensorBoard and W&B (offline): (its log_dir,
    its run directory, the command's result)."""
    log_dir = tmp_path_factory.mktemp("logs")
    result = run_cli("vision_task.train", f"data.root={image_folder}", *RUN, "trainer.max_epochs=2",
                     "logger=[tensorboard,wandb]", log_dir=log_dir)  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    return log_dir, only(log_dir / "runs"), result


def images(event_dir) -> list[str]:
    events = EventAccumulator(str(event_dir))
    events.Reload()
    return events.Tags()["images"]


def grid_size(count: int) -> tuple[int, int]:
    """(width, height) in pixels of the image grid of ``count`` of the folder's 32x32 images."""
    height, width, _ = figure_pixels(image_grid(torch.zeros(count, 3, 32, 32), [""] * count)).shape
    return width, height


def served_images(log_dir: Path, stderr_file: Path) -> dict[str, Image.Image]:
    """Every image of the one run in ``log_dir``, fetched from a real ``tensorboard`` server as its
    Images tab does (the tags, then each tag's image) and decoded: ``{tag: image}``."""
    # --port 0: the server binds a free port itself and prints its URL, so no port can clash.
    command = [sys.executable, "-m", "tensorboard.main", "--logdir", str(log_dir), "--host", "127.0.0.1",
               "--port", "0"]  # fmt: skip
    with stderr_file.open("w") as stderr:
        server = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=stderr)
    try:

        def wait_for(condition, timeout: float = 90):
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                assert server.poll() is None, f"tensorboard exited:\n{stderr_file.read_text()[-3000:]}"
                if found := condition():
                    return found
                time.sleep(0.5)
            raise AssertionError(f"tensorboard not ready after {timeout} s:\n{stderr_file.read_text()[-3000:]}")

        url = wait_for(lambda: re.search(r"TensorBoard \S+ at (http://127\.0\.0\.1:\d+/)", stderr_file.read_text()))[1]

        def get(path: str, **query: str) -> bytes:
            with urllib.request.urlopen(f"{url}{path}?{urllib.parse.urlencode(query)}", timeout=30) as response:
                return response.read()

        (run,) = wait_for(lambda: json.loads(get("data/runs")))
        served = {}
        for tag in json.loads(get("data/plugin/images/tags"))[run]:
            (entry,) = json.loads(get("data/plugin/images/images", run=run, tag=tag))
            data = get("data/plugin/images/individualImage", **dict(urllib.parse.parse_qsl(entry["query"])))
            served[tag] = Image.open(io.BytesIO(data))
            assert served[tag].format == "PNG", tag
        return served
    finally:
        server.terminate()
        server.wait(timeout=30)


def test_images_show_an_input_batch_the_confusion_matrix_and_every_misclassified_image(tracked, tmp_path):
    """TensorBoard's Images tab shows rank 0's first batch, the confusion matrix and every misclassified test image."""
    log_dir, run_dir, _ = tracked
    metrics = json.loads((run_dir / "metrics.json").read_text())
    served = served_images(log_dir, tmp_path / "stderr.txt")
    assert set(served) == FIGURES
    assert served["train/input_batch"].size == grid_size(32), "rank 0's first batch: 32 images"
    assert served["test/confusion_matrix"].size == (560, 480)
    wrong = round((1 - metrics["test/acc"]) * TEST_SIZE)
    assert 0 < wrong <= 64, "5% of the folder's labels are wrong"
    assert served["test/misclassified"].size == grid_size(wrong), "every misclassified image, 8 a row"


def wandb_records(path: Path):
    """The records of a W&B ``.wandb`` file, as ``wandb_internal_pb2.Record``.

    The file is a LevelDB log (the format W&B documents for it): a 7-byte header ``:W&B``, magic
    0xBEE1, version 0; then 32 KiB blocks of chunks, each a 7-byte header (CRC32, length, type:
    1 full, 2 first, 3 middle, 4 last) and its bytes. The records are W&B's own protobuf messages.
    """
    data, block, header = path.read_bytes(), 32768, 7
    assert struct.unpack("<4sHB", data[:header]) == (b":W&B", 0xBEE1, 0)
    offset, chunks = header, b""
    while offset + header <= len(data):
        if block - offset % block < header:  # the rest of a block too short for a header: padding
            offset += block - offset % block
            continue
        _, length, kind = struct.unpack("<IHB", data[offset : offset + header])
        if (kind, length) == (0, 0):
            break
        chunks += data[offset + header : offset + header + length]
        offset += header + length
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(chunks)
            yield record
            chunks = b""


def test_wandb_offline_run_holds_the_figures(tracked):
    """The offline W&B run holds each figure as an image."""
    _, run_dir, _ = tracked
    (path,) = (run_dir / "wandb").glob("offline-run-*/run-*.wandb")
    history = {}
    for record in wandb_records(path):
        if record.WhichOneof("record_type") == "history":
            for item in record.history.item:
                history.setdefault(item.key or "/".join(item.nested_key), []).append(json.loads(item.value_json))
    for tag in FIGURES:
        assert history[f"{tag}/_type"] == ["images/separated"], tag


def monitored(checkpoint: str) -> tuple[str, str]:
    """What the best checkpoint's ModelCheckpoint monitored, and its mode, as the checkpoint records them."""
    states = torch.load(checkpoint, weights_only=True)["callbacks"]
    ((monitor, score),) = [
        (state["monitor"], state["best_model_score"]) for state in states.values() if state["monitor"]
    ]
    (mode,) = re.findall(r"'mode': '(\w+)'", next(key for key in states if f"'monitor': '{monitor}'" in key))
    assert score is not None
    return monitor, mode


def test_the_image_tasks_figures_and_results_line(tracked):
    """The image task keeps its figures, its objective (the highest val/acc) and its metrics in its final line."""
    _, run_dir, result = tracked
    assert {"train/input_batch", "test/confusion_matrix"} <= set(images(run_dir / "tensorboard"))
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert metrics["objective"] == "val/acc"
    shown = ", ".join(f"{name} {metrics[name]:.4f}" for name in ("val/acc", "test/acc", "val/loss", "test/loss"))
    assert f"Results: {shown} (checkpoint" in result.stdout + result.stderr
    assert monitored(metrics["checkpoint"]) == ("val/acc", "max")


def test_an_evaluation_draws_the_trainings_test_figures_again(tracked, tmp_path):
    """An evaluation of the best checkpoint on 2 processes logs the test figures into its own
    TensorBoard run: the same misclassified images as the training's test, pixel for pixel."""
    _, run_dir, _ = tracked
    expected = json.loads((run_dir / "metrics.json").read_text())
    result = run_cli("vision_task.eval", *RUN, f"ckpt_path={expected['checkpoint']}", log_dir=tmp_path)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    evaluation = only(tmp_path / "evals")
    assert json.loads((evaluation / "metrics.json").read_text())["test/acc"] == expected["test/acc"]
    evaluated, trained = (EventAccumulator(str(d / "tensorboard")).Reload() for d in (evaluation, run_dir))
    assert set(evaluated.Tags()["images"]) == {"test/confusion_matrix", "test/misclassified"}
    (grid,), (trained_grid,) = evaluated.Images("test/misclassified"), trained.Images("test/misclassified")
    assert grid.encoded_image_string == trained_grid.encoded_image_string


def test_the_figures_leave_train_and_eval_by_configuration(image_folder, tmp_path):
    """With its figure callbacks removed by configuration, a training draws no image, and neither
    does an evaluation of its checkpoint (it takes the run's task)."""
    result = run_cli("vision_task.train", f"data.root={image_folder}", *RUN, "trainer.max_epochs=1", *NO_FIGURES,
                     log_dir=tmp_path)  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    run_dir = only(tmp_path / "runs")
    assert images(run_dir / "tensorboard") == []
    checkpoint = json.loads((run_dir / "metrics.json").read_text())["checkpoint"]
    evaluated = run_cli("vision_task.eval", f"ckpt_path={checkpoint}", *RUN, log_dir=tmp_path)
    assert evaluated.returncode == 0, evaluated.stdout[-3000:] + evaluated.stderr[-5000:]
    assert images(only(tmp_path / "evals") / "tensorboard") == []
