"""The engine runs a task it was not written for: the test project's regression on float sensor
windows, not images (sensor_task/), on real gloo processes through its real command line
(``python -m sensor_task.train``). It declares its objective (``val/mse``, minimized), its metrics,
no figures, no predict and no export (its Task: sensor_task/task.py). Its
DataModule passes the conformance check; its evaluation gives the same MSE on 1, 2 and 3
processes; a run SIGKILLed inside an epoch and resumed in place is bit-identical to the
uninterrupted one; a sweep's summary shows its metrics; predict and export refuse it in one line."""

import csv
import json
import os
import re
import shutil
import signal
import subprocess
import time

import pytest
import torch
from harness import HERE, cli_command, cli_env, only, read_scalars, run_cli
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from ddp_engine.data.conformance import check_conformance
from sensor_task.regression import make_sensor_windows

pytestmark = pytest.mark.processes

#: 3 epochs of 13 steps (600 windows over 2 processes at a global batch of 48), last.ckpt every 5 steps.
TRAIN = (
    "trainer.accelerator=cpu", "trainer.devices=2", "trainer.max_epochs=3",
    "callbacks.last_checkpoint.train_time_interval=null", "callbacks.last_checkpoint.every_n_train_steps=5",
)  # fmt: skip
KILL_AFTER = 17  # inside epoch 1; its last.ckpt is step 15's


@pytest.fixture(scope="module")
def windows(tmp_path_factory):
    return make_sensor_windows(tmp_path_factory.mktemp("sensors") / "windows.npz")


@pytest.fixture(scope="module")
def trained(windows, tmp_path_factory):
    """The uninterrupted 2-process training: (its run directory, the command's result)."""
    log_dir = tmp_path_factory.mktemp("regression")
    result = run_cli("sensor_task.train", *TRAIN, f"data.path={windows}", log_dir=log_dir)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return only(log_dir / "runs"), result


def params(run_dir):
    return torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]


def test_its_datamodule_passes_the_conformance_check(windows):
    report = check_conformance({"_target_": "sensor_task.regression.SensorDataModule", "path": str(windows),
                                "global_batch_size": 48})  # fmt: skip
    assert report.split_sizes == {"train": 600, "val": 97, "test": 131}
    for world_size in (2, 3):
        assert report.world_sizes[world_size].trained_per_epoch == (600 - 600 % world_size,) * 2
        assert report.world_sizes[world_size].evaluated["test"] == 131


def test_it_trains_and_keeps_the_checkpoint_of_the_lowest_val_mse(trained):
    run, result = trained
    scalars = read_scalars(run / "tensorboard")
    per_epoch = scalars["val/mse"][:-1]  # then the best checkpoint's, validated again
    best_epoch = min(range(3), key=per_epoch.__getitem__)
    metrics = json.loads((run / "metrics.json").read_text())
    assert metrics["status"] == "completed" and metrics["objective"] == "val/mse"
    assert metrics["checkpoint"].endswith(f"epoch_{best_epoch:03d}.ckpt")
    assert metrics["val/mse"] == pytest.approx(min(per_epoch), rel=1e-6)
    # The targets' variance is about 3.6: a model that learned nothing has an MSE near it.
    assert metrics["test/mse"] < 0.5, metrics
    shown = ", ".join(f"{name} {metrics[name]:.4f}" for name in ("val/mse", "test/mse", "val/mae", "test/mae"))
    assert f"Results: {shown} (checkpoint" in result.stdout + result.stderr
    assert "Data set: sensor windows 3x128 from " in (run / "train.log").read_text()
    events = EventAccumulator(str(run / "tensorboard"))
    events.Reload()
    assert events.Tags()["images"] == [], "a task without figures draws none"


def test_its_evaluation_gives_the_same_mse_on_1_2_and_3_processes(trained, tmp_path):
    run, _ = trained
    trained_metrics = json.loads((run / "metrics.json").read_text())
    evaluated = {}
    for devices in (1, 2, 3):
        log_dir = tmp_path / str(devices)
        result = run_cli("sensor_task.eval", f"ckpt_path={trained_metrics['checkpoint']}", "trainer.accelerator=cpu",
                         f"trainer.devices={devices}", log_dir=log_dir)  # fmt: skip
        assert result.returncode == 0, result.stderr[-3000:]
        evaluated[devices] = json.loads((only(log_dir / "evals") / "metrics.json").read_text())
    # Each window is evaluated once on any world size; the MSE's sums are float64. A window's
    # prediction is float32, computed in batches of another size on each world size: the same to
    # float32 rounding (1e-7), while one window counted twice would move the MSE by about 1e-2.
    for devices, metrics in evaluated.items():
        assert metrics["world_size"] == devices
        assert metrics["test/mse"] == pytest.approx(trained_metrics["test/mse"], rel=1e-6), devices
        assert metrics["test/mae"] == pytest.approx(trained_metrics["test/mae"], rel=1e-6), devices


def test_a_run_killed_inside_an_epoch_resumes_in_place_bit_identical(trained, windows, tmp_path):
    full, _ = trained
    marker, release = tmp_path / "paused", tmp_path / "release"
    pause = (
        "+callbacks.pause._target_=probes.PauseAfterStep", f"+callbacks.pause.step={KILL_AFTER}",
        f"+callbacks.pause.marker={marker}", f"+callbacks.pause.release={release}", "+callbacks.pause.seconds=1",
    )  # fmt: skip
    command = cli_command("sensor_task.train", *TRAIN, f"data.path={windows}", *pause, log_dir=tmp_path / "logs")
    run = subprocess.Popen(command, cwd=HERE, env=cli_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                           start_new_session=True)  # fmt: skip
    try:
        deadline = time.time() + 300
        while not marker.exists() and run.poll() is None and time.time() < deadline:
            time.sleep(0.05)
        assert marker.exists(), "the run never reached its step 17"
    finally:
        os.killpg(run.pid, signal.SIGKILL)  # the whole command: supervisor, forkserver, both ranks
        run.wait()
    run_dir = only(tmp_path / "logs" / "runs")
    saved = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)
    assert (saved["global_step"], saved["epoch"]) == (15, 1), "killed inside epoch 1, after step 15's checkpoint"
    release.touch()  # the resumed run trains on without pausing

    resumed = run_cli("sensor_task.train", f"hydra.run.dir={run_dir}", "ckpt_path=last", log_dir=tmp_path / "logs")
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    for key, value in params(full).items():
        assert torch.equal(params(run_dir)[key], value), key
    ours, theirs = (json.loads((path / "metrics.json").read_text()) for path in (run_dir, full))
    assert ours["test/mse"] == theirs["test/mse"] and ours["val/mse"] == theirs["val/mse"]


def test_a_sweep_summarizes_its_metrics(windows, tmp_path):
    sweep_dir = tmp_path / "sweep"
    result = run_cli("sensor_task.train", "-m", f"data.path={windows}", "trainer.accelerator=cpu", "trainer.devices=1",
                     "trainer.max_epochs=1", "model.optimizer.lr=0.01,0.003", f"hydra.sweep.dir={sweep_dir}",
                     log_dir=tmp_path)  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    with open(sweep_dir / "summary.csv", newline="") as file:
        rows = list(csv.DictReader(file))
    assert list(rows[0]) == ["job", "overrides", "status", "val/mse", "test/mse", "val/mae", "test/mae", "best",
                             "error", "directory"]  # fmt: skip
    scores = {}
    for row in rows:
        metrics = json.loads((sweep_dir / row["job"] / "metrics.json").read_text())
        assert row["status"] == "completed" and metrics["objective"] == "val/mse"
        assert row["val/mse"] == f"{metrics['val/mse']:.4f}" and row["test/mae"] == f"{metrics['test/mae']:.4f}"
        scores[row["job"]] = metrics["val/mse"]
    assert [re.search(r"lr=([\d.]+)", row["overrides"])[1] for row in rows] == ["0.01", "0.003"]
    # The best job by the task's objective, in its direction (the lowest val/mse), marked and named last.
    best = min(scores, key=scores.get)
    assert {row["job"]: row["best"] for row in rows} == {job: "min val/mse" if job == best else "" for job in scores}
    last = (result.stdout + result.stderr).strip().splitlines()[-1]
    assert last.endswith(f"Best job: #{best}, val/mse={scores[best]:.4f} (min): {sweep_dir / best}"), last
    cores = len(os.sched_getaffinity(0))
    assert (
        f"2 jobs at a time, each on its own CPU cores: each job runs 1 process and this machine has {cores} CPU cores."
        if cores >= 2
        else "Jobs one after another, in this process: each job runs 1 process and this machine has 1 CPU cores"
    ) in result.stdout, "how the jobs run, and why"


@pytest.mark.parametrize("command", ["predict", "export"])
def test_predict_and_export_refuse_a_task_that_has_none_in_one_line(trained, windows, command, tmp_path):
    run, _ = trained
    checkpoint = json.loads((run / "metrics.json").read_text())["checkpoint"]
    extra = [f"input={windows}"] if command == "predict" else []
    before = sorted(path.name for path in (run / "checkpoints").iterdir())
    result = run_cli(f"sensor_task.{command}", f"ckpt_path={checkpoint}", *extra, log_dir=tmp_path)
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        f"Error: {command}: the task sensor_task has no {command}: declare one in its Task (sensor_task.task.TASK: "
        f"{command}=TaskCommand(...); engine/docs/tasks.md)."
    ]
    assert list(tmp_path.iterdir()) == [], "no run directory"
    assert sorted(path.name for path in (run / "checkpoints").iterdir()) == before, "no export beside the checkpoint"


COMMANDS = '''"""The task's own predict and export: each records what it was given."""

import json
import os
from pathlib import Path


def predict(cfg):
    out = Path(cfg.paths.output_dir) / f"rank_{os.environ.get('RANK', '0')}.json"
    out.write_text(json.dumps({"checkpoint": cfg.ckpt_path}))
    return {"predictions": str(out.parent)}


def export(cfg):
    out = Path(cfg.paths.output_dir) / "exported.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"checkpoint": cfg.ckpt_path}))
    return {"output": str(out)}
'''


def test_the_refusals_fix_declaring_predict_and_export_in_the_task_lets_the_same_checkpoint_through(trained, tmp_path):
    """What the refusal says to do (``predict=TaskCommand(...)`` in the Task), done in a copy of the
    task: the checkpoint of a run trained before it goes through, as the task's code now says."""
    run, _ = trained
    checkpoint = json.loads((run / "metrics.json").read_text())["checkpoint"]
    project = tmp_path / "project"
    shutil.copytree(HERE / "sensor_task", project / "sensor_task", ignore=shutil.ignore_patterns("__pycache__"))
    (project / "sensor_task" / "commands.py").write_text(COMMANDS)
    task = project / "sensor_task" / "task.py"
    text = task.read_text().replace("from ddp_engine.api import Task", "from ddp_engine.api import Task, TaskCommand")
    task.write_text(text.replace('    mode="min",\n', '    mode="min",\n'
                                 '    predict=TaskCommand(run="sensor_task.commands:predict"),\n'
                                 '    export=TaskCommand(run="sensor_task.commands:export"),\n'))  # fmt: skip

    def command(name: str) -> subprocess.CompletedProcess:
        # From the copy's folder: python -m finds the copy before engine/tests on PYTHONPATH.
        args = cli_command(f"sensor_task.{name}", f"ckpt_path={checkpoint}", "trainer.accelerator=cpu",
                           "trainer.devices=2", log_dir=tmp_path / "logs")  # fmt: skip
        if name == "export":
            args.remove("trainer.accelerator=cpu"), args.remove("trainer.devices=2")
        return subprocess.run(args, cwd=project, env=cli_env(), capture_output=True, text=True, timeout=300)

    predicted = command("predict")
    assert predicted.returncode == 0, predicted.stdout[-2000:] + predicted.stderr[-3000:]
    (out,) = (tmp_path / "logs" / "predictions").iterdir()
    written = {path.name: json.loads(path.read_text()) for path in out.glob("rank_*.json")}
    assert written == {f"rank_{rank}.json": {"checkpoint": checkpoint} for rank in (0, 1)}, "both processes ran it"
    exported = command("export")
    assert exported.returncode == 0, exported.stdout[-2000:] + exported.stderr[-3000:]
    (out,) = (tmp_path / "logs" / "exports").iterdir()
    assert json.loads((out / "exported.json").read_text()) == {"checkpoint": checkpoint}
