"""SLURM's variables, as srun sets them for one task of a many-node job, mapped to ranks, the
rendezvous address and the batch layout (no cluster here: the variables are set in this process),
and the requeue callback's own refusals; which failure of a job's processes is named as its cause."""

import os

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.hydra_config import HydraConfig
from hydra.utils import instantiate
from lightning.fabric.plugins.environments import SLURMEnvironment
from omegaconf import open_dict
from torch.distributed.elastic.multiprocessing.errors import ErrorHandler, ProcessFailure

from ddp_engine.callbacks.signals import RequeueOnSlurmSignal
from ddp_engine.core.environment import launcher_rank, run_stamp
from ddp_engine.core.errors import ConfigValueError
from ddp_engine.distributed.checkpoint_io import LastCheckpoint
from ddp_engine.distributed.failures import describe_failure, root_failure
from ddp_engine.run.trainer import build_trainer


def test_slurm_variables_map_to_ranks_on_many_nodes(test_task, monkeypatch, tmp_path):
    """Task 5 of 8 on 4 nodes gets global rank 5, local rank 1, node rank 2, the first node's
    address, a port from the job id and an eighth of the global batch; the requeue callback
    refuses a run without last.ckpt and says how to resume where scontrol is missing."""
    slurm = {"SLURM_JOB_ID": "1234567", "SLURM_JOB_NAME": "sensor-task", "SLURM_NTASKS": "8",
             "SLURM_NTASKS_PER_NODE": "2", "SLURM_JOB_NUM_NODES": "4", "SLURM_NNODES": "4",
             "SLURM_PROCID": "5", "SLURM_LOCALID": "1", "SLURM_NODEID": "2", "SLURM_STEP_ID": "0",
             "SLURM_NODELIST": "gpu[07-10]"}  # fmt: skip
    for key, value in slurm.items():
        monkeypatch.setenv(key, value)
    # Lightning's SLURMEnvironment exports MASTER_ADDR and MASTER_PORT into this process: set then
    # delete them here, so that monkeypatch removes them again afterwards.
    for key in ("MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID", "RANK", "LOCAL_RANK", "WORLD_SIZE"):
        monkeypatch.setenv(key, "")
        monkeypatch.delenv(key)
    assert run_stamp() == "slurm-1234567.0" and launcher_rank() == 5

    overrides = ["trainer.accelerator=cpu", "trainer.devices=2", "trainer.num_nodes=4", f"paths.log_dir={tmp_path}"]
    with initialize_config_dir(config_dir=str(test_task.configs()), version_base="1.3"):
        cfg = compose("config", overrides=overrides, return_hydra_config=True)
    cfg.hydra.runtime.output_dir = str(tmp_path / "run")
    HydraConfig.instance().set_config(cfg)
    with open_dict(cfg):
        del cfg["hydra"]
    trainer, layout = build_trainer(cfg)
    environment = trainer.strategy.cluster_environment
    assert isinstance(environment, SLURMEnvironment)
    assert (environment.global_rank(), environment.local_rank(), environment.node_rank()) == (5, 1, 2)
    assert environment.world_size() == layout["world_size"] == 8
    assert (environment.main_address, environment.main_port) == ("gpu07", 15000 + 4567)
    assert layout["per_device_batch_size"] == cfg.data.global_batch_size // 8 == 48 // 8
    assert os.environ["MASTER_ADDR"] == "gpu07", "exported by Lightning, removed by monkeypatch after the test"

    # The requeue callback needs last.ckpt to save, and says so before training when it is gone.
    (requeue,) = (callback for callback in trainer.callbacks if isinstance(callback, RequeueOnSlurmSignal))
    trainer.callbacks = [callback for callback in trainer.callbacks if not isinstance(callback, LastCheckpoint)]
    with pytest.raises(ConfigValueError, match="no callbacks.last_checkpoint: put it back"):
        requeue.setup(trainer, None, "fit")
    # Without scontrol the job is not requeued, and the message says how to resume by hand.
    monkeypatch.setenv("PATH", str(tmp_path))
    assert RequeueOnSlurmSignal._requeue("/run/last.ckpt") == (
        "scontrol requeue 1234567 failed (no scontrol on PATH): the job does not run again by itself; resume it "
        "with ckpt_path=/run/last.ckpt."
    )


def test_the_failure_named_is_the_cause_not_the_agents_sigterm_that_followed_it():
    """A rank that stopped on a SIGTERM it handled is the cause, not the rank the agent SIGTERMed
    after it, even where that one's record bears the earlier second; another signal (the OOM
    killer's SIGKILL) still comes before a stop."""
    # Rank 0 exited 143 on its own handler; rank 1 had already recorded its lost connection and no
    # longer handled SIGTERM when the agent sent it.
    stopped = ProcessFailure(local_rank=0, pid=10, exitcode=143, error_file="/nonexistent")
    killed = ProcessFailure(local_rank=1, pid=11, exitcode=-15, error_file="/nonexistent")
    killed.timestamp = stopped.timestamp - 1
    assert root_failure({0: stopped, 1: killed})[0] == 0
    oom = ProcessFailure(local_rank=1, pid=11, exitcode=-9, error_file="/nonexistent")
    assert root_failure({0: stopped, 1: oom})[0] == 1


def test_a_recorded_exception_is_named_even_when_the_process_then_died_by_a_signal(tmp_path, monkeypatch):
    """A worker that recorded its exception (torch's ``@record``, here its ErrorHandler) and then
    died by SIGABRT on its way out is named by its exception, not the signal."""
    # gloo's threads abort a process at exit after a failed collective.
    error_file = tmp_path / "error.json"
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(error_file))
    try:
        raise RuntimeError("injected failure on rank 1 at step 2")
    except RuntimeError as error:
        ErrorHandler().record_exception(error)
    aborted = ProcessFailure(local_rank=1, pid=11, exitcode=-6, error_file=str(error_file))
    assert describe_failure(aborted) == "RuntimeError: injected failure on rank 1 at step 2"
    # Without a record, the signal is all there is to say.
    unrecorded = ProcessFailure(local_rank=0, pid=10, exitcode=-6, error_file=str(tmp_path / "none.json"))
    assert describe_failure(unrecorded) == "killed by SIGABRT (exit status -6)"
    assert root_failure({0: unrecorded, 1: aborted})[0] == 1


def test_a_recorded_exception_whose_first_line_is_a_heading_is_named_with_its_cause(tmp_path, monkeypatch):
    """An exception whose first line is only a heading (Hydra's instantiate: "Error in call to
    target 'X':", the target's error on the next line) is named with that cause, on one line."""
    # A Trainer that refuses its precision: the heading alone would say nothing of why.
    error_file = tmp_path / "error.json"
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(error_file))
    with pytest.raises(Exception) as raised:
        instantiate({"_target_": "lightning.pytorch.Trainer", "precision": 17, "logger": False})
    ErrorHandler().record_exception(raised.value)
    failure = ProcessFailure(local_rank=0, pid=10, exitcode=1, error_file=str(error_file))
    line = describe_failure(failure)
    assert line.startswith(
        "InstantiationException: Error in call to target 'lightning.pytorch.trainer.trainer.Trainer': "
    ), line
    assert 'ValueError("Precision 17 is invalid. Allowed precision values: (' in line and "\n" not in line, line
