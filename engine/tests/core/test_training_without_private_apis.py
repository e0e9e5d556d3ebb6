"""The test task's default training through its real command line, with the private names of the
libraries that ``ddp_engine.core.compat`` reads hidden from compat in its every process, as
releases that rename them would leave them (a sitecustomize: ``private_api.hiding_sitecustomize``;
the libraries keep using their own): all at once here, each alone in the ``in_turn`` tests
(``make test-private-apis``). The run completes and learns, and each process says once what it lost.
"""

import json
import os
import re
from collections import Counter

import pytest
from harness import cli_env, only, read_scalars, run_cli
from private_api import LOST, compat_private_names, hiding_sitecustomize
from runs import TRAIN

pytestmark = pytest.mark.processes

#: A test MSE below it: the run learnt (the targets' variance is about 3.6; one epoch reaches about 0.1).
MSE_LEARNT = 0.5


def _train_with_hidden(hidden, sensor_data, tmp_path):
    """The default 2-process training (1 epoch) with the private names ``hidden`` from compat in
    its every process (a sitecustomize; the libraries keep their own), checked to have completed
    and learnt; returns its log and console, and how often each name was said lost in its
    ``train.log``."""
    site = hiding_sitecustomize(tmp_path / "site", hidden)
    result = run_cli(
        TRAIN, *sensor_data, "trainer.accelerator=cpu", "trainer.devices=2", "trainer.max_epochs=1",
        log_dir=tmp_path / "logs", env={"PYTHONPATH": os.pathsep.join([str(site), cli_env()["PYTHONPATH"]])},
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    run = only(tmp_path / "logs" / "runs")
    metrics = json.loads((run / "metrics.json").read_text())
    assert metrics["status"] == "completed" and metrics["test/mse"] < MSE_LEARNT, metrics
    assert read_scalars(run / "tensorboard")["test/mse"][-1] == pytest.approx(
        metrics["test/mse"]
    )  # TensorBoard's charts
    assert (run / "checkpoints" / "last.ckpt").is_file()
    log = (run / "train.log").read_text()
    return log + result.stdout + result.stderr, Counter(re.findall(rf"- (\S+){re.escape(LOST)}", log))


def test_the_default_training_completes_with_every_private_api_that_compat_reads_hidden(sensor_data, tmp_path):
    # As if a release of each library had renamed every private name the engine reads: the default
    # 2-process training still learns, writes its results, and each process says once what it lost.
    output, said = _train_with_hidden(compat_private_names(), sensor_data, tmp_path)
    # The names on the default path, each said once by each process that reached it: the command's
    # own (its lines in train.log are rank 0's too) and the two ranks.
    default_path = {
        "Trainer._logger_connector.should_update_logs", "_TrainingEpochLoop._broadcast_sigterm_tensor",
        "DistributedDataParallel._get_ddp_logging_data", "DistributedDataParallel._set_ddp_runtime_logging_sample_rate",
        "Backend.Options._timeout", "ModelCheckpoint._every_n_epochs", "ModelCheckpoint._save_topk_checkpoint",
        "SummaryWriter._get_file_writer", "Trainer.fit_loop.epoch_loop.batch_progress", "atexit._run_exitfuncs",
    }  # fmt: skip
    assert set(said) >= default_path and max(said.values()) <= 3, said
    # And the command's start, before the run's log exists: on its console.
    for start in ("forkserver.ensure_running", "dynamic_rendezvous.get_method_name", "Hydra.get_mode"):
        assert f"{start}{LOST}" in output, start


@pytest.mark.in_turn
@pytest.mark.parametrize("name", sorted(compat_private_names()))
def test_the_default_training_completes_with_each_private_api_that_compat_reads_hidden_alone(
    name, sensor_data, tmp_path
):
    # One library's release renames one private name (make test-private-apis; not in make test,
    # whose all-at-once test above covers the same paths in one run): each alone also leaves a run
    # that completes, and a name on the default path is said lost at most once per process.
    _, said = _train_with_hidden({name}, sensor_data, tmp_path)
    assert all(name in lost for lost in said) and max(said.values(), default=0) <= 3, said
