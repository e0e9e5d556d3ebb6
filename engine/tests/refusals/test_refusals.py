"""Settings the schema cannot see, refused before any process launches and before any run
directory exists: GPUs this machine does not have, a launcher that started another number of
processes, options the device cannot run, a log folder that cannot be written, a rendezvous
address that cannot work, a directory that holds or runs another run.

Each is checked in process, on the test task (the regression), through the function the command
runs first (:func:`~ddp_engine.config.command_line.check_command_line`) or the one the supervisor
runs before it starts the workers; the command line's own contract (one line on stderr, exit
status 1, no directory) is checked once in refusals/test_refusals_cli.py. The machine here has no
GPU, so GPU counts are mocked where a machine with GPUs is needed (torch.cuda.is_available /
device_count); so is SLURM, by its variables.
"""

import multiprocessing
import os
import re
import signal
import socket
import time

import pytest
import torch
from omegaconf import OmegaConf

from ddp_engine.config.checks import basic_sweeper, check_output_dir, check_sweep_dir
from ddp_engine.config.command_line import check_command_line
from ddp_engine.core.errors import ConfigValueError, UsageError
from ddp_engine.core.run_dir import SWEEP_DIR_ENV, restart_hint
from ddp_engine.distributed.layout import check_device_options
from ddp_engine.launch import supervisor
from ddp_engine.launch.supervisor import check_rendezvous_address, run_dir_lock
from sensor_task.regression import Regressor

CPU = ("trainer.accelerator=cpu", "trainer.devices=2", "data.global_batch_size=64")


@pytest.fixture
def cpu(sensor_data) -> tuple[str, ...]:
    """A command line of 2 CPU processes on the test task's data."""
    return (*CPU, *sensor_data)


def refused(*overrides: str) -> str:
    """The message a command line with ``overrides`` is refused with."""
    with pytest.raises(UsageError) as error:
        check_command_line("config", list(overrides))
    message = str(error.value)
    assert "\n" not in message, "one line"
    return message


def test_more_gpus_than_the_machine_has_are_refused(sensor_data):
    # Real: this machine's own GPU count (none here, so any GPU request is more than it has).
    available = torch.cuda.device_count()
    expected = (
        "trainer.accelerator=gpu needs GPUs, but this machine has none: 0 visible"
        if available == 0
        else f"trainer.devices={available + 1}: "  # then Lightning's own words, and the count
    )
    message = refused(*sensor_data, "trainer.accelerator=gpu", f"trainer.devices={available + 1}")
    assert message.startswith(expected) and (available == 0 or f"({available} visible)" in message), message


@pytest.mark.parametrize(
    ("devices", "message"),
    [
        # Lightning's own parser counts them (CUDAAccelerator.parse_devices); the message adds the key and the fix.
        # Patterns: Lightning's words between them are not asserted.
        ("2", re.compile(r"trainer\.devices=2: .* \(1 visible\)\. Use")),
        ("[0,3]", re.compile(r"trainer\.devices=\[0, 3\]: .* \(1 visible\)\.")),
        ("[0,0]", re.compile(r"trainer\.devices=\[0, 0\]: .* \(1 visible\)\.")),
        ("0", "trainer.devices=0 is not a positive GPU count, a list of GPU indices, -1 or auto (every GPU)."),
    ],
)
def test_gpu_counts_and_indices_are_checked_against_the_visible_gpus(monkeypatch, devices, message, sensor_data):
    # Mocked: a machine with one GPU (none exists here).
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    with pytest.raises(ConfigValueError, match=message if isinstance(message, re.Pattern) else re.escape(message)):
        check_command_line("config", [*sensor_data, "trainer.accelerator=gpu", f"trainer.devices={devices}"])
    check_command_line("config", ["trainer.accelerator=gpu", "trainer.devices=1", *sensor_data])


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        # Lightning itself would train in bf16-mixed instead, with a warning.
        (["trainer.precision=16-mixed"], "trainer.precision=16-mixed (fp16 mixed precision) needs CUDA devices, and "
         "this run is on cpu. Use trainer.precision=bf16-mixed (mixed precision on CPU) or 32-true."),
        (["trainer.sync_batchnorm=true"], "trainer.sync_batchnorm=true needs GPUs"),
        (["strategy.process_group_backend=nccl"], "strategy.process_group_backend=nccl needs CUDA devices"),
    ],
)  # fmt: skip
def test_gpu_only_options_on_cpu_are_refused(overrides, message, cpu):
    assert refused(*cpu, *overrides).startswith(message)


@pytest.mark.parametrize(
    ("environment", "overrides", "message"),
    [
        # torchrun with 2 nodes of 1 process: the product matches, the processes per node do not.
        ({"TORCHELASTIC_RUN_ID": "x", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "1", "RANK": "0", "LOCAL_RANK": "0",
          "GROUP_RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"},
         ["trainer.devices=2"], "trainer.devices=2 processes per node, but torchrun started 1 per node"),
        # Mocked SLURM (no cluster here): 2 nodes of 4 tasks.
        ({"SLURM_NTASKS": "8", "SLURM_NTASKS_PER_NODE": "4", "SLURM_NNODES": "2", "SLURM_JOB_NAME": "train",
          "SLURM_JOB_ID": "1234",
          "SLURM_PROCID": "0", "SLURM_LOCALID": "0", "SLURM_NODEID": "0", "SLURM_NODELIST": "node1"},
         ["trainer.devices=4", "trainer.num_nodes=1"],
         # Lightning's own sentence (SLURMEnvironment), then the engine's fix: a pattern, its values only.
         re.compile(r".*num_nodes=1.*--nodes=2.*Set trainer\.num_nodes and trainer\.devices to the launcher's nodes "
                    r"and processes per node \(sbatch --nodes / --ntasks-per-node\)\.")),
    ],
)  # fmt: skip
def test_a_layout_other_than_the_launchers_is_refused(monkeypatch, environment, overrides, message, sensor_data):
    for key, value in environment.items():
        monkeypatch.setenv(key, value)
    with pytest.raises(ConfigValueError) as error:
        check_command_line("config", [*sensor_data, "trainer.accelerator=cpu", "data.global_batch_size=64", *overrides])
    if isinstance(message, re.Pattern):
        assert message.match(str(error.value)), str(error.value)
    else:
        assert str(error.value).startswith(message)


def test_a_log_folder_below_a_file_is_refused(tmp_path, cpu):
    a_file = tmp_path / "a_file"
    a_file.write_text("")
    log_dir = a_file / "logs"
    assert refused(*cpu, f"paths.log_dir={log_dir}") == (
        f"paths.log_dir={log_dir} cannot be written (creating a file in {a_file}: {a_file} is a file). Point "
        "paths.log_dir at a folder you can write, e.g. paths.log_dir=$HOME/logs."
    )


def test_a_preset_setting_an_argument_the_model_lacks_names_it_and_the_fix(tmp_path, sensor_data):
    # A preset written for another network (its batch_norm) meets the regression's, which has none.
    (tmp_path / "experiment").mkdir()
    (tmp_path / "experiment" / "normed.yaml").write_text("# @package _global_\nmodel:\n  net:\n    batch_norm: true\n")
    preset = ["trainer.accelerator=cpu", f"hydra.searchpath=[file://{tmp_path}]", "+experiment=normed", *sensor_data]
    with pytest.raises(UsageError) as error:
        check_command_line("config", preset)
    message = str(error.value)
    for fragment in ("model.net.batch_norm is set", "sensor_task.regression.SensorNet does not take it",
                     "drop it with ~model.net.batch_norm"):  # fmt: skip
        assert fragment in message, message
    check_command_line("config", [*preset, "~model.net.batch_norm"])


def test_a_busy_master_port_and_an_unresolvable_master_addr_are_refused(monkeypatch, cpu):
    # Real: something listens on the port (as another run's rendezvous or any server would).
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        monkeypatch.setenv("MASTER_PORT", str(port))
        assert refused(*cpu).startswith(
            f"MASTER_PORT={port} is busy (something else is listening there): unset MASTER_PORT"
        )
    monkeypatch.delenv("MASTER_PORT")
    with pytest.raises(ConfigValueError, match=r"MASTER_ADDR=no-such-host.invalid does not resolve .*: unset it"):
        check_rendezvous_address({"MASTER_ADDR": "no-such-host.invalid"})
    with pytest.raises(ConfigValueError, match="MASTER_PORT=http is not a port number"):
        check_rendezvous_address({"MASTER_PORT": "http"})
    check_rendezvous_address({})  # unset: the OS picks a free port


@pytest.mark.parametrize(
    "mark", ["checkpoints/last.ckpt", "checkpoints/epoch_000.ckpt", "metrics.json", "tensorboard/events.out.tfevents.1"]
)
def test_a_new_run_into_the_directory_of_an_earlier_run_is_refused(tmp_path, mark, cpu):
    # What a run leaves behind that a second one would overwrite: any of these marks a run.
    log_dir = tmp_path / "logs"
    run = log_dir / "runs" / "earlier"
    (run / mark).parent.mkdir(parents=True)
    (run / mark).write_text("results")
    before = {path: path.stat().st_mtime_ns for path in run.rglob("*")}
    if mark.startswith("checkpoints/"):  # a run to resume
        assert refused(*cpu, f"hydra.run.dir={run}", f"paths.log_dir={log_dir}") == (
            f"hydra.run.dir={run} already holds a run: starting another there would overwrite its checkpoints "
            "and metrics. Start it in another directory (hydra.run.dir=<new folder>, or leave hydra.run.dir unset for "
            "a fresh one), or resume that run in place with ckpt_path=last and the same directory."
        )
    else:  # one that stopped before its first checkpoint: resuming it is refused too, so the way on is named
        assert refused(*cpu, f"hydra.run.dir={run}", f"paths.log_dir={log_dir}") == (
            f"hydra.run.dir={run} holds a run that stopped before its first checkpoint: starting another there would "
            "overwrite the logs that say why. There is nothing to resume: start it again in another directory "
            f"(hydra.run.dir=<new folder>, or leave hydra.run.dir unset for a fresh one), or move {run} away first."
        )
    assert {path: path.stat().st_mtime_ns for path in run.rglob("*")} == before, "nothing written"
    # Resuming in place is the way on; a sweep into a folder of runs that is no sweep is refused too.
    check_output_dir(run, resume=True)
    with pytest.raises(ConfigValueError, match=f"hydra.sweep.dir={log_dir / 'runs'} holds files but no sweep"):
        check_sweep_dir(log_dir / "runs", [], resume=False, sweeper={"_target_": basic_sweeper()})
    # Nor one of the user's own files: the sweep would move its job-numbered folders aside.
    (mine := tmp_path / "mine" / "0").mkdir(parents=True)
    (mine / "data.txt").write_text("mine")
    with pytest.raises(ConfigValueError, match=f"hydra.sweep.dir={mine.parent} holds files but no sweep"):
        check_sweep_dir(mine.parent, [], resume=False, sweeper={"_target_": basic_sweeper()})
    check_output_dir(tmp_path / "new", resume=False)
    # A completed run has nothing to resume: the way on is another directory only.
    (run / "metrics.json").write_text('{"status": "completed"}')
    (run / "checkpoints").mkdir(exist_ok=True)
    with pytest.raises(ConfigValueError, match=r"holds a completed run: .* a fresh one\)\.$"):
        check_output_dir(run, resume=False)


def test_several_nodes_without_a_launcher_are_refused(sensor_data):
    with pytest.raises(ConfigValueError, match="trainer.num_nodes=2: a run on several machines needs a launcher"):
        check_command_line("config", ["trainer.accelerator=cpu", "trainer.num_nodes=2", *sensor_data])


def test_a_master_addr_of_another_machine_is_refused():
    # 192.0.2.1 (TEST-NET-1, RFC 5737) is never an address of this machine; nothing is sent to it.
    with pytest.raises(ConfigValueError, match="MASTER_ADDR=192.0.2.1 is not an address of this machine"):
        check_rendezvous_address({"MASTER_ADDR": "192.0.2.1"})
    check_rendezvous_address({"MASTER_ADDR": "127.0.0.1"})


def test_a_second_command_into_a_directory_in_use_is_refused(tmp_path, cpu):
    # A real second process holds the directory, as a command started a moment earlier would
    # (forked from this one: the same code, without the seconds of a fresh interpreter's imports).
    context = multiprocessing.get_context("fork")
    holding = context.Event()
    holder = context.Process(target=hold_run_dir, args=(tmp_path, holding), daemon=True)
    holder.start()
    try:
        assert holding.wait(timeout=30)
        in_use = rf"{tmp_path} is in use by another run \(pid {holder.pid}\)"
        with pytest.raises(ConfigValueError, match=in_use):
            with run_dir_lock(tmp_path):
                pass
        # The check before launch refuses it too, before Hydra logs into the directory, and writes nothing;
        # so is a resume in place of the running run.
        before = sorted(tmp_path.rglob("*"))
        for resume in ([], ["ckpt_path=last"]):
            assert re.match(in_use, refused(*cpu, f"hydra.run.dir={tmp_path}", *resume))
        assert sorted(tmp_path.rglob("*")) == before and (tmp_path / ".lock").read_text() == str(holder.pid)
    finally:
        holder.kill()
        holder.join(timeout=30)
    with run_dir_lock(tmp_path):  # released when its holder ended, even by SIGKILL
        assert (tmp_path / ".lock").read_text() == str(os.getpid())


def test_a_checked_command_holds_the_run_directory_it_names_before_hydra_writes_there(tmp_path, cpu):
    # Two commands started into the same hydra.run.dir at once both passed the check for a holder
    # (nobody held it yet): the one the lock refused later had rewritten the other's .hydra/ on its way.
    run_dir = tmp_path / "run"
    check_command_line("config", [*cpu, f"hydra.run.dir={run_dir}"])
    try:
        assert [path.name for path in run_dir.iterdir()] == [".lock"] and (run_dir / ".lock").read_text() == str(
            os.getpid()
        )
        context = multiprocessing.get_context("fork")  # another process, as the second command is
        second = context.Process(target=lock_and_report, args=(run_dir, queue := context.Queue()))
        second.start()
        assert queue.get(timeout=30) == f"{run_dir} is in use by another run (pid {os.getpid()})"
        second.join(timeout=30)
        with run_dir_lock(run_dir):  # this process's job then finds its directory held already
            pass
    finally:
        supervisor._held_run_dirs.pop(run_dir.resolve()).close()  # let it go: the test process lives on
    # A directory the command line does not name (the start time's, by default) is not written before Hydra.
    check_command_line("config", [*cpu, f"paths.log_dir={tmp_path / 'logs'}"])
    assert not (tmp_path / "logs").exists()


def lock_and_report(path, queue) -> None:
    supervisor._held_run_dirs.clear()  # forked with this process's state: a second command has none
    try:
        with run_dir_lock(path):
            queue.put("taken")
    except ConfigValueError as refused:
        queue.put(str(refused).split(":")[0])


def hold_run_dir(path, holding) -> None:
    with run_dir_lock(path):
        holding.set()
        time.sleep(600)


def test_nccl_and_sync_batchnorm_need_cuda():
    with pytest.raises(ConfigValueError, match="process_group_backend=nccl needs CUDA devices, but this run is on cpu"):
        check_device_options("cpu", "nccl", sync_batchnorm=False)
    with pytest.raises(ConfigValueError, match="sync_batchnorm=true needs GPUs"):
        check_device_options("cpu", None, sync_batchnorm=True)
    check_device_options("cpu", "gloo", sync_batchnorm=False)
    check_device_options("cuda", "nccl", sync_batchnorm=True)
    check_device_options("cuda", "gloo", sync_batchnorm=False)  # gloo also runs on GPUs


def test_a_resume_in_place_with_nothing_to_resume_is_refused(tmp_path, cpu):
    # Lightning would warn deep in the log and train afresh; the command says so before anything.
    run = tmp_path / "run"
    assert "does not exist" in refused(*cpu, f"hydra.run.dir={run}", "ckpt_path=last")
    run.mkdir()
    # Stopped before its first checkpoint: the way on is another directory, which a new run takes.
    assert refused(*cpu, f"hydra.run.dir={run}", "ckpt_path=last") == (
        f"ckpt_path=last resumes the run in hydra.run.dir={run}, which holds no checkpoint (checkpoints/*.ckpt): it "
        "stopped before its first. There is nothing to resume: start it again in another directory (hydra.run.dir=<new "
        f"folder>, or leave hydra.run.dir unset for a fresh one), or move {run} away first."
    )
    check_command_line("config", [*cpu, f"hydra.run.dir={tmp_path / 'new'}"])
    # A save in progress (or one that failed) is no checkpoint to resume from.
    (run / "checkpoints").mkdir()
    (run / "checkpoints" / ".last.ckpt.123.abcd.tmp").write_bytes(b"half a checkpoint")
    assert "which holds no checkpoint (checkpoints/*.ckpt)" in refused(*cpu, f"hydra.run.dir={run}", "ckpt_path=last")
    # Without its last.ckpt (a full disk, or callbacks.last_checkpoint dropped) but with an epoch's: it
    # resumes from that one (distributed/checkpoint_io.py: resume_point).
    (run / "checkpoints" / "epoch_000.ckpt").write_bytes(b"a checkpoint")
    (run / "metrics.json").write_text('{"status": "failed"}')
    check_command_line("config", [*cpu, f"hydra.run.dir={run}", "ckpt_path=last"])
    (run / "checkpoints" / "last.ckpt").write_bytes(b"a checkpoint")
    (run / "metrics.json").write_text('{"status": "stopped"}')
    check_command_line("config", [*cpu, f"hydra.run.dir={run}", "ckpt_path=last"])
    (run / "metrics.json").write_text('{"status": "completed"}')
    assert "completed (its metrics.json), so there is nothing to resume" in refused(
        *cpu, f"hydra.run.dir={run}", "ckpt_path=last"
    )
    # An unset shell variable would make the current folder (the checkout) the run directory.
    assert refused(*cpu, "hydra.run.dir=", "ckpt_path=last").startswith("hydra.run.dir is empty")


def test_a_job_of_a_sweep_that_stopped_before_its_first_checkpoint_is_started_again_by_its_sweep(monkeypatch):
    # What rank 0 logs when such a job stops (callbacks/signals.py): continuing the sweep moves its
    # outputs aside and starts it again (launch/sweep_launcher.py); another directory is not the way.
    monkeypatch.setenv(SWEEP_DIR_ENV, "/sweeps/lr")
    assert restart_hint("/sweeps/lr/3") == (
        "Continue its sweep with the same command and hydra.sweep.dir=/sweeps/lr, which starts it again."
    )


class SavesItsPartials(Regressor):
    """A LightningModule of one's own that records its arguments with Lightning's save_hyperparameters(),
    and takes one more, a config node as Hydra passes it (``+model.notes={...}``)."""

    def __init__(self, *args, notes=None, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.save_hyperparameters(ignore=["net"])


def test_hyperparameters_a_checkpoint_could_not_load_are_refused_before_launch(cpu):
    # The optimizer and scheduler partials and the config node would be pickled into every checkpoint;
    # the engine loads checkpoints with weights_only=True, so the run would fail when it tests its best
    # checkpoint.
    scheduler = "model.scheduler={_target_:torch.optim.lr_scheduler.OneCycleLR,_partial_:true,max_lr:0.01}"
    with pytest.raises(ConfigValueError) as refused:
        check_command_line("config", [*cpu, f"model._target_={__name__}.SavesItsPartials", scheduler,
                                      "+model.notes={source:windows}"])  # fmt: skip
    assert str(refused.value) == (
        "model: SavesItsPartials.save_hyperparameters() keeps notes, optimizer, scheduler in every checkpoint, "
        "which then no longer loads with torch.load(weights_only=True), as the template loads checkpoints. Leave them "
        "out (save_hyperparameters(ignore=['notes', 'optimizer', 'scheduler'])); the run's .hydra/config.yaml "
        "records how it was built."
    )


def test_a_stop_before_the_workers_start_passes_through_a_library_unchanged():
    # The stop handler raises wherever the supervisor is: inside OmegaConf (writing the job file),
    # which re-raised an Exception as type(error)(message), a ValueError with a traceback.
    def stop() -> None:
        raise supervisor.JobInterrupted(signal.SIGINT, workers_started=False)

    OmegaConf.register_new_resolver("test_stop", stop, replace=True)
    try:
        with pytest.raises(supervisor.JobInterrupted) as stopped:
            OmegaConf.to_container(OmegaConf.create({"value": "${test_stop:}"}), resolve=True)
    finally:
        OmegaConf.clear_resolver("test_stop")
    assert (stopped.value.signum, stopped.value.workers_started) == (signal.SIGINT, False)
