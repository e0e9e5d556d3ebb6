"""The ``logger`` group: composing several trackers, continuing their runs across starts of one run,
the CSV history kept by a resume, and a missing tracker package refused in one line; composed with
the test task's configs (registered by engine/tests/conftest.py).

With the real packages (``mlflow``, ``wandb``: the ``dev`` extra installs them) and MLflow's real
SQLite store, offline. What a two-process run writes to each tracker: monitoring/test_trackers_cli.py.
"""

import csv
from pathlib import Path

import pytest
from harness import read_scalars, scalars_as_the_app_shows
from hydra import compose, initialize_config_dir
from lightning.pytorch.loggers import CSVLogger as LightningCSVLogger
from lightning.pytorch.loggers import MLFlowLogger
from lightning.pytorch.loggers import TensorBoardLogger as LightningTensorBoardLogger
from lightning.pytorch.utilities import rank_zero_only

from ddp_engine.config.command_line import check_command_line
from ddp_engine.config.compose import composed_jobs
from ddp_engine.core.errors import UsageError
from ddp_engine.loggers import trackers
from ddp_engine.loggers.csv_logger import CSVLogger
from ddp_engine.loggers.tensorboard_logger import TensorBoardLogger
from ddp_engine.loggers.trackers import TRACKER_RUNS_FILE, build_loggers, check_tracker_packages, record_tracker_runs
from sensor_task.task import TASK

#: The test task's configs (sensor_task/conf), as its commands read them.
CONFIG_DIR = TASK.configs()


def logger_config(tmp_path: Path, *overrides: str):
    """The ``logger`` node composed with ``overrides``, its paths under ``tmp_path``."""
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        cfg = compose("config", overrides=[f"paths.log_dir={tmp_path}", "paths.output_dir=" + str(tmp_path / "run"),
                                           *overrides])  # fmt: skip
    return cfg.logger


def test_the_logger_group_composes_several_trackers_each_under_its_own_key(tmp_path):
    """``logger=[...]`` composes each chosen tracker under its own key (TensorBoard alone by default),
    and a mistyped key or option is refused naming the ones there are."""
    assert [key for key, node in logger_config(tmp_path).items() if node] == ["tensorboard"], "the default"
    cfg = logger_config(tmp_path, "logger=[csv,mlflow,wandb]")
    assert [key for key, node in cfg.items() if node] == ["csv", "mlflow", "wandb"]
    assert cfg.mlflow.tracking_uri == f"sqlite:///{tmp_path}/mlflow.db" and cfg.wandb.offline is True
    assert not any(logger_config(tmp_path, "logger=[]").values()), "logger=[]: no logger"
    # Each refusal names the keys or options there are.
    refusals = {
        ("logger=mlflow", "logger.mlflow.trackinguri=x"): "Unknown key logger.mlflow.trackinguri (keys of "
        "logger.mlflow: _target_, artifact_location, experiment_name, log_model, run_name, tags, tracking_uri). "
        "Did you mean logger.mlflow.tracking_uri?",
        ("logger.mlflow.trackinguri=x",): "logger.mlflow.trackinguri: logger.mlflow is not selected, so it has no "
        "keys to set; select it first: logger=mlflow, or logger=[tensorboard,mlflow] for both.",
        ("logger=[csv,nonexistent]",): "logger=nonexistent: no such option (available: csv, mlflow, tensorboard, "
        "wandb; yours go in conf/logger/).",
        ("logger=tensorbord",): "logger=tensorbord: no such option (available: csv, mlflow, tensorboard, wandb; "
        "yours go in conf/logger/). Did you mean logger=tensorboard?",
    }
    for overrides, message in refusals.items():
        with pytest.raises(UsageError) as error:
            composed_jobs("config", list(overrides))
        assert str(error.value) == message


def test_a_restarted_run_continues_its_mlflow_run(tmp_path, monkeypatch):
    """A run started again in its directory logs into the same MLflow run (trackers.json), and
    TensorBoard drops the points after the resumed step; another directory gets another MLflow run."""
    # As global rank 0, which writes trackers.json (an earlier test's Trainer may have set another rank).
    monkeypatch.setattr(rank_zero_only, "rank", 0)
    (tmp_path / "run").mkdir()
    cfg = logger_config(tmp_path, "logger=[tensorboard,mlflow]")
    first = build_loggers(cfg, tmp_path / "run", tmp_path)
    assert [type(logger) for logger in first] == [TensorBoardLogger, MLFlowLogger]
    record_tracker_runs(cfg, first, tmp_path / "run")
    run_id = first[1].run_id
    assert (tmp_path / "run" / TRACKER_RUNS_FILE).is_file()
    assert first[1].experiment.get_run(run_id).info.run_name == "run", "named by the run directory"

    again = build_loggers(cfg, tmp_path / "run", tmp_path, purge_step=7)
    assert again[1].run_id == run_id, "the same MLflow run"
    assert again[0].purge_step == again[0]._kwargs["purge_step"] == 7, "TensorBoard drops the points after it"
    client = again[1].experiment
    assert len(client.search_runs([again[1].experiment_id])) == 1
    # Another run directory: another MLflow run in the same store.
    (tmp_path / "other").mkdir()
    other = build_loggers(cfg, tmp_path / "other", tmp_path)
    assert other[1].run_id != run_id and len(client.search_runs([again[1].experiment_id])) == 2


def write_rows(path: Path, steps: range) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as file:
        writer = csv.DictWriter(file, fieldnames=["step", "train/loss", "val/acc"])
        writer.writeheader()
        writer.writerows({"step": step, "train/loss": 1 / (step + 1), "val/acc": ""} for step in steps)


def read_rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as file:
        return list(csv.DictReader(file))


def test_a_resumed_csv_log_keeps_the_rows_before_its_checkpoint(tmp_path):
    """The engine's CSV log of a resumed run keeps the rows before its checkpoint (Lightning's starts over)
    and replaces those after it."""
    metrics = tmp_path / "csv" / "metrics.csv"
    write_rows(metrics, range(10))
    # Lightning's own logger starts the file over: the history of the run is gone.
    lightning = LightningCSVLogger(tmp_path, name="csv", version="")
    lightning.log_metrics({"train/loss": 0.5}, step=10)
    lightning.save()
    assert [row["step"] for row in read_rows(metrics)] == ["10"]

    write_rows(metrics, range(10))
    logger = CSVLogger(tmp_path, name="csv", version="", purge_step=6)
    logger.log_metrics({"train/loss": 0.25, "test/acc": 0.75}, step=6)
    logger.save()
    rows = read_rows(metrics)
    assert [int(row["step"]) for row in rows] == [0, 1, 2, 3, 4, 5, 6], "steps 6 to 9 logged again by the resume"
    assert float(rows[2]["train/loss"]) == 1 / 3 and rows[2]["test/acc"] == "", "old rows as they were"
    assert (float(rows[6]["train/loss"]), float(rows[6]["test/acc"])) == (0.25, 0.75)


def test_a_tracker_whose_package_is_missing_is_refused_naming_the_extra(sensor_data, tmp_path, monkeypatch):
    """A tracker whose package is not installed is refused in one line naming the extra to install."""
    cfg = logger_config(tmp_path, "logger=[tensorboard,wandb]")
    check_tracker_packages(cfg)  # installed here
    # A package that does not exist here, in wandb's place: what a user without the extra sees.
    monkeypatch.setitem(trackers.TRACKER_PACKAGES, trackers.WandbLogger, "wandb_not_installed")
    with pytest.raises(UsageError) as error:
        check_command_line("config", [*sensor_data, "trainer.accelerator=cpu", "logger=[tensorboard,wandb]"])
    assert str(error.value) == (
        "logger.wandb needs the wandb_not_installed package, which is not installed: "
        "pip install 'ddp-engine[wandb_not_installed]' (or pip install wandb_not_installed)."
    )


def log_steps(logger, steps: range, value: float) -> None:
    for step in steps:
        logger.log_metrics({"train/loss": value + step}, step=step)
    logger.finalize("success")


@pytest.mark.parametrize("cls", [LightningTensorBoardLogger, TensorBoardLogger], ids=["lightning", "engine"])
def test_a_resumed_tensorboard_run_shows_each_step_once_in_every_reader(tmp_path, monkeypatch, cls):
    """The engine's TensorBoard logger of a resumed run shows each step once, the resume's value, in
    both TensorBoard readers; Lightning's shows the replaced steps twice in the app."""
    monkeypatch.setattr(rank_zero_only, "rank", 0)
    # The first start logs steps 0 to 9 and is stopped; its checkpoint was at step 6, so the resume
    # logs 6 to 9 again, with other values (the steps it takes after the checkpoint).
    log_steps(cls(tmp_path, name="tb", version=""), range(10), 0.0)
    log_steps(cls(tmp_path, name="tb", version="", purge_step=6), range(6, 10), 100.0)
    expected = [(step, float(step)) for step in range(6)] + [(step, 100.0 + step) for step in range(6, 10)]
    shown = scalars_as_the_app_shows(tmp_path / "tb")["train/loss"]
    if cls is LightningTensorBoardLogger:
        # torch's one START marker at step 6: the TensorBoard app's loader takes it for the run's own
        # start and shows steps 6 to 9 twice, once from each start (EventAccumulator drops them).
        assert [step for step, _ in shown] == [*range(10), *range(6, 10)]
        with pytest.raises(AssertionError, match="disagree"):
            read_scalars(tmp_path / "tb")
        return
    assert shown == expected, "the app's loader"
    assert read_scalars(tmp_path / "tb", steps=True)["train/loss"] == expected, "EventAccumulator"
