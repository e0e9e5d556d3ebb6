"""The trackers as a user sees them, on a finished two-process run of the test task (conftest's
``sensor_run``). TensorBoard: a real ``tensorboard`` server, asked through its HTTP API (the one
its web pages use) for scalars, hparams and text. CSV: the files read back. W&B: the offline
run's records, read from its ``.wandb`` file with W&B's own protobuf classes. The figures each
tracker gets (the regression draws none): vision/test_figures_in_trackers.py.
"""

import csv
import json
import math
import re
import struct
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
from harness import only, run_cli
from runs import TRAIN
from wandb.proto import wandb_internal_pb2

pytestmark = pytest.mark.processes

# The sensor run (conftest.sensor_run): 600 training windows, 300 per rank in micro-batches of 24,
# so 13 optimizer steps per epoch; 2 epochs; logged every 10 steps.
STEPS_PER_EPOCH, EPOCHS, LOG_EVERY = math.ceil(300 / 24), 2, 10
SCALARS = {
    "train/loss", "train/lr", "val/mse", "val/mae", "test/mse", "test/mae", "time/epoch_s",
    "throughput/samples_per_sec", "throughput/rank_0/samples_per_sec", "throughput/rank_1/samples_per_sec",
}  # fmt: skip


class TensorBoard:
    """A ``tensorboard`` server process on 127.0.0.1 and a client of its HTTP API."""

    def __init__(self, log_dir: Path, stderr_file: Path) -> None:
        self.stderr_file = stderr_file
        # --port 0: the server binds a free port itself and prints its URL, so no port can clash.
        command = [sys.executable, "-m", "tensorboard.main", "--logdir", str(log_dir), "--host", "127.0.0.1",
                   "--port", "0"]  # fmt: skip
        with stderr_file.open("w") as stderr:
            self.process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=stderr)
        self.url = self._wait_for(lambda: re.search(r"TensorBoard \S+ at (http://127\.0\.0\.1:\d+/)", self._log()))[1]

    def _log(self) -> str:
        return self.stderr_file.read_text()

    def _wait_for(self, condition, timeout: float = 90):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.process.poll() is None, f"tensorboard exited:\n{self._log()[-3000:]}"
            if result := condition():
                return result
            time.sleep(0.5)
        raise AssertionError(f"tensorboard not ready after {timeout} s:\n{self._log()[-3000:]}")

    def get(self, path: str, **query: str) -> bytes:
        with urllib.request.urlopen(f"{self.url}{path}?{urllib.parse.urlencode(query)}", timeout=30) as response:
            return response.read()

    def get_json(self, path: str, **query: str):
        return json.loads(self.get(path, **query))

    def post_json(self, path: str, body: dict):
        request = urllib.request.Request(
            f"{self.url}{path}", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=30) as response:
            return json.loads(response.read())

    def wait_for_run(self) -> str:
        """The name of the one run, once the server has loaded it."""
        (run,) = self._wait_for(lambda: self.get_json("data/runs"))
        return run

    def stop(self) -> int:
        self.process.terminate()
        return self.process.wait(timeout=30)


@pytest.fixture(scope="module")
def board(sensor_run, tmp_path_factory):
    """(server, run name, run directory, metrics.json) for the sensor two-process run."""
    log_dir, _ = sensor_run
    (run_dir,) = (log_dir / "runs").iterdir()
    server = TensorBoard(log_dir, tmp_path_factory.mktemp("tensorboard") / "stderr.txt")
    try:
        yield server, server.wait_for_run(), run_dir, json.loads((run_dir / "metrics.json").read_text())
    finally:
        server.stop()
    assert server.process.poll() is not None, "the server is stopped"


def scalar_points(server: TensorBoard, run: str, tag: str) -> list[tuple[int, float]]:
    """``(step, value)`` of every point of a scalar tag."""
    return [(step, value) for _, step, value in server.get_json("data/plugin/scalars/scalars", run=run, tag=tag)]


def test_scalars_served_hold_the_run_metrics_throughput_and_epoch_times(board):
    """TensorBoard serves the run's metrics, each rank's memory figures, the throughput per 10 steps and
    per epoch's rest, and each epoch's time."""
    server, run, run_dir, metrics = board
    assert run == f"runs/{run_dir.name}/tensorboard", "one TensorBoard run per job, named by its run directory"
    tags = set(server.get_json("data/plugin/scalars/tags")[run])
    assert SCALARS <= tags, SCALARS - tags
    # On the CPU: each rank's tensor figures and resident memory; the GPU's figures (peak_mib, cuda_*,
    # other) are absent.
    figures = ("parameters", "gradients", "ddp_buckets", "optimizer_state", "host_rss")
    assert {tag for tag in tags if tag.startswith("memory/")} == {
        f"memory/rank_{rank}/{figure}_mib" for rank in (0, 1) for figure in figures
    }

    (test_mse,) = scalar_points(server, run, "test/mse")
    assert test_mse[1] == pytest.approx(metrics["test/mse"], abs=1e-7)
    val_mse = scalar_points(server, run, "val/mse")
    assert len(val_mse) == EPOCHS + 1 and val_mse[-1][1] == pytest.approx(metrics["val/mse"], abs=1e-7)

    # One throughput window per 10 optimizer steps, and one more for the rest of each epoch.
    total = STEPS_PER_EPOCH * EPOCHS
    epoch_ends = range(STEPS_PER_EPOCH, total + 1, STEPS_PER_EPOCH)
    expected_steps = sorted({*range(LOG_EVERY, total + 1, LOG_EVERY), *epoch_ends})
    # Logged at the index of each window's last step (0-based), as Lightning logs train/loss.
    expected_steps = [step - 1 for step in expected_steps]
    overall = scalar_points(server, run, "throughput/samples_per_sec")
    per_rank = [scalar_points(server, run, f"throughput/rank_{rank}/samples_per_sec") for rank in (0, 1)]
    assert [step for step, _ in overall] == expected_steps
    for (step, value), *ranks in zip(overall, *per_rank):
        assert all(rank_step == step and rate > 0 for rank_step, rate in ranks)
        # All samples over the slowest rank's time: at most the sum of the ranks' own rates,
        # at least the slowest rank's.
        rates = [rate for _, rate in ranks]
        assert min(rates) <= value <= sum(rates) * (1 + 1e-6)

    epoch_times = scalar_points(server, run, "time/epoch_s")
    assert [step for step, _ in epoch_times] == [step for step, _ in val_mse[:EPOCHS]] == [s - 1 for s in epoch_ends]
    assert all(0 < seconds < 300 for _, seconds in epoch_times)


#: The test task's metrics, which HPARAMS shows as its metric columns.
TASK_METRICS = ["val/mse", "test/mse", "val/mae", "test/mae"]


def test_hparams_table_shows_the_config_layout_and_final_metrics(board):
    """HPARAMS shows the task's metrics as columns, the job's overrides first, the run's layout and
    the best checkpoint's metrics."""
    server, run, _, metrics = board
    experiment = server.post_json("data/plugin/hparams/experiment", {"experimentName": ""})
    # The task's metrics (sensor_task/task.py: its Task's metrics), in its order.
    assert [info["name"]["tag"] for info in experiment["metricInfos"]] == TASK_METRICS
    names = [info["name"] for info in experiment["hparamInfos"]]
    assert {"world_size", "backend", "per_device_batch_size", "global_batch_size", "model.optimizer.lr"} <= set(names)
    # The job's own overrides are the first columns (by name), the others after them.
    overrides = ["data.path", "logger", "paths.log_dir", "trainer.accelerator", "trainer.devices",
                 "trainer.max_epochs"]  # fmt: skip
    assert names[: len(overrides)] == overrides and len(names) > 100

    (group,) = server.post_json(
        "data/plugin/hparams/session_groups",
        {"experimentName": "", "startIndex": 0, "sliceSize": 10,
         "allowedStatuses": ["STATUS_UNKNOWN", "STATUS_SUCCESS", "STATUS_FAILURE", "STATUS_RUNNING"],
         "colParams": [{"hparam": "world_size"}, *({"metric": {"tag": tag}} for tag in TASK_METRICS)]},
    )["sessionGroups"]  # fmt: skip
    assert group["name"] == run
    hparams = group["hparams"]
    assert hparams["world_size"] == 2 and hparams["backend"] == "gloo"
    assert hparams["global_batch_size"] == hparams["data.global_batch_size"] == 48
    assert hparams["per_device_batch_size"] == 24
    assert hparams["model.net.hidden"] == 16 and hparams["trainer.devices"] == 2
    assert hparams["lr_scaling.rule"] == "none" and hparams["effective_lr"] == hparams["model.optimizer.lr"]
    values = {value["name"]["tag"]: value["value"] for value in group["metricValues"]}
    for tag in TASK_METRICS:  # the best checkpoint's validation and its test, as metrics.json holds them
        assert values[tag] == pytest.approx(metrics[tag], abs=1e-7), tag


def test_text_tab_holds_the_composed_config(board):
    """The Text tab holds the run's composed config."""
    server, run, run_dir, _ = board
    (entry,) = server.get_json("data/plugin/text/text", run=run, tag="config/text_summary")
    assert "global_batch_size: 48" in entry["text"] and f"output_dir: {run_dir}" in entry["text"]


# --- debug=trace: a torch.profiler trace per rank ---------------------------------------------


def test_debug_trace_writes_a_trace_per_rank_with_the_allreduce_and_the_optimizer_step(sensor_data, tmp_path):
    """``debug=trace`` writes a Chrome trace per rank, holding the recorded steps, each with its
    AllReduce and optimizer step."""
    # Micro-batches of 8: each rank validates 5 batches (debug=trace's limit), after the sanity
    # check's 2. Where a stage has fewer than 5 steps (the validation's 2 batches of 24 and the sanity
    # check's would be 4), Lightning's profiler drops its schedule and records every step of every
    # stage into one trace, named by the stage it ends in.
    result = run_cli(TRAIN, *sensor_data, "debug=trace", "trainer.accelerator=cpu", "trainer.devices=2",
                     "data.global_batch_size=16", log_dir=tmp_path)  # fmt: skip
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    traces = only(tmp_path / "runs") / "traces"
    for rank in (0, 1):
        (path,) = traces.glob(f"fit-trace-{rank}-*training_step*.pt.trace.json")
        trace = json.loads(path.read_text())  # the Chrome trace format Perfetto and chrome://tracing open
        assert (trace["distributedInfo"]["rank"], trace["distributedInfo"]["world_size"]) == (rank, 2)
        names = {event.get("name", "") for event in trace["traceEvents"]}
        # The 3 steps the schedule records (Lightning's default: 1 skipped, 1 of warm-up), each with its AllReduce.
        steps = {name for name in names if name.startswith("ProfilerStep#")}
        assert steps >= {"ProfilerStep#2", "ProfilerStep#3", "ProfilerStep#4"}, (path, steps)
        assert "gloo:all_reduce" in names and any(name.startswith("Optimizer.step#") for name in names), path


# --- CSV and W&B (offline): the same run ---------------------------------------------------------


def test_csv_log_holds_the_metrics_and_the_settings(board):
    """The CSV log holds every scalar, the test metric once, a validation per epoch and the best's,
    and the run's settings."""
    _, _, run_dir, metrics = board
    with (run_dir / "csv" / "metrics.csv").open(newline="") as file:
        rows = list(csv.DictReader(file))
    test_mse = [float(row["test/mse"]) for row in rows if row["test/mse"]]
    assert test_mse == [pytest.approx(metrics["test/mse"], abs=1e-7)]
    assert len([row for row in rows if row["val/mse"]]) == EPOCHS + 1
    assert SCALARS <= set(rows[0]), SCALARS - set(rows[0])
    settings = (run_dir / "csv" / "hparams.yaml").read_text()
    assert "data.global_batch_size: 48\n" in settings and "world_size: 2\n" in settings


def wandb_records(path: Path):
    """The records of a W&B ``.wandb`` file, as ``wandb_internal_pb2.Record``.

    The file is a LevelDB log (the format W&B documents for it): a 7-byte header ``:W&B``, magic
    0xBEE1, version 0; then 32 KiB blocks of chunks, each a 7-byte header (CRC32, length, type:
    1 full, 2 first, 3 middle, 4 last) and its bytes. W&B's Python reader was removed when its
    Go core took over; the records are W&B's own protobuf messages.
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


def test_wandb_offline_run_holds_the_metrics_and_the_config(board):
    """The offline W&B run is named by the run directory in the task's project, recorded in
    trackers.json, and holds the metrics and the config."""
    _, _, run_dir, metrics = board
    (path,) = (run_dir / "wandb").glob("offline-run-*/run-*.wandb")
    records = list(wandb_records(path))
    (run,) = [record.run for record in records if record.WhichOneof("record_type") == "run"]
    assert run.display_name == f"runs/{run_dir.name}" and run.project == "sensor-task"
    assert json.loads((run_dir / "trackers.json").read_text())["wandb"]["id"] == run.run_id
    history = {}
    for record in records:
        if record.WhichOneof("record_type") == "history":
            for item in record.history.item:
                history.setdefault(item.key or "/".join(item.nested_key), []).append(json.loads(item.value_json))
    assert history["test/mse"] == [pytest.approx(metrics["test/mse"], abs=1e-7)]
    assert len(history["val/mse"]) == EPOCHS + 1
    configs = [record.config for record in records if record.WhichOneof("record_type") == "config"]
    config = {item.key: json.loads(item.value_json) for update in configs for item in update.update}
    assert config["data.global_batch_size"] == 48 and config["world_size"] == 2
