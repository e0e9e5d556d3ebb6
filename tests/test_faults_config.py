"""Settings the schema cannot see, refused as one line before any process launches and before
any run directory exists: GPUs this machine does not have, a launcher that started another
number of processes, a precision the device cannot run, a log folder that cannot be written.

(SyncBatchNorm and NCCL on CPU are in test_ddp_failures.py.) The machine here has no GPU, so the
GPU counts of the in-process checks are mocked (torch.cuda.is_available / device_count); so is
SLURM, by its variables. torchrun runs for real.
"""

import os
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch
from conftest import REPO, cli_command, cli_env, run_cli, torchrun

from mnist_ddp.cli.preflight import check_command_line, check_output_dir
from mnist_ddp.distributed.launch import check_rendezvous_address, run_dir_lock
from mnist_ddp.errors import ConfigValueError, UsageError

QUICK = ("trainer.accelerator=cpu", "trainer.devices=2", "trainer.max_epochs=1", "data.global_batch_size=64")


def assert_refused_before_anything(result, log_dir: Path, message: str) -> None:
    assert result.returncode == 1, result.stdout[-2000:] + result.stderr[-3000:]
    assert result.stderr.startswith(f"Error: {message}"), result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.stderr
    assert not (log_dir / "runs").exists(), "no run directory, no process"


def test_more_gpus_than_the_machine_has_are_refused(synthetic_data_dir, tmp_path):
    # Real: this machine's own GPU count (none here, so any GPU request is more than it has).
    available = torch.cuda.device_count()
    result = run_cli(f"data.data_dir={synthetic_data_dir}", "trainer.accelerator=gpu",
                     f"trainer.devices={available + 1}", log_dir=tmp_path)  # fmt: skip
    expected = (
        "trainer.accelerator=gpu needs GPUs, but this machine has none: 0 visible"
        if available == 0
        else f"trainer.devices={available + 1} asks for more GPUs than this machine has: {available} visible"
    )
    assert_refused_before_anything(result, tmp_path, expected)


@pytest.mark.parametrize(
    ("devices", "message"),
    [
        ("2", "trainer.devices=2 asks for more GPUs than this machine has: 1 visible. Use trainer.devices=1"),
        ("[0,3]", "trainer.devices=[0, 3] names GPUs that do not exist: 1 visible, indices 0..0."),
    ],
)
def test_gpu_counts_and_indices_are_checked_against_the_visible_gpus(monkeypatch, devices, message):
    # Mocked: a machine with one GPU (none exists here).
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    with pytest.raises(ConfigValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        check_command_line("config", ["trainer.accelerator=gpu", f"trainer.devices={devices}"])
    check_command_line("config", ["trainer.accelerator=gpu", "trainer.devices=1"])


def test_fp16_mixed_precision_on_cpu_is_refused(synthetic_data_dir, tmp_path):
    # Lightning itself would train in bf16-mixed instead, with a warning.
    result = run_cli(f"data.data_dir={synthetic_data_dir}", *QUICK, "trainer.precision=16-mixed", log_dir=tmp_path)
    assert_refused_before_anything(
        result, tmp_path, "trainer.precision=16-mixed (fp16 mixed precision) needs CUDA devices, and this run is "
        "on cpu. Use trainer.precision=bf16-mixed (mixed precision on CPU) or 32-true."
    )  # fmt: skip


def test_num_nodes_that_torchrun_did_not_start_are_refused_in_every_process(synthetic_data_dir, tmp_path):
    result = torchrun(
        "--standalone", "--nproc-per-node=2",
        overrides=(f"data.data_dir={synthetic_data_dir}", *QUICK, "trainer.num_nodes=2"), log_dir=tmp_path, timeout=300,
    )  # fmt: skip
    assert result.returncode != 0
    message = (
        "Error: You set devices=2 and num_nodes=2 in Lightning, but the product (2 * 2) does not match the world "
        "size (2). Set trainer.num_nodes and trainer.devices to the launcher's nodes and processes per node "
        "(torchrun --nnodes / --nproc-per-node)."
    )
    assert (result.stdout + result.stderr).count(message) == 2, "each of the 2 processes refuses"
    assert not (tmp_path / "runs").exists(), "no run directory"


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
         "You set num_nodes=1 in Lightning, but the number of nodes configured in SLURM --nodes=2 does not match. "
         "HINT: Set num_nodes=2. Set trainer.num_nodes and trainer.devices to the launcher's nodes and processes "
         "per node (sbatch --nodes / --ntasks-per-node)."),
    ],
)  # fmt: skip
def test_a_layout_other_than_the_launchers_is_refused(monkeypatch, environment, overrides, message):
    for key, value in environment.items():
        monkeypatch.setenv(key, value)
    with pytest.raises(ConfigValueError) as error:
        check_command_line("config", ["trainer.accelerator=cpu", "data.global_batch_size=64", *overrides])
    assert str(error.value).startswith(message)


def test_a_log_folder_below_a_file_is_refused(synthetic_data_dir, tmp_path):
    (tmp_path / "a_file").write_text("")
    log_dir = tmp_path / "a_file" / "logs"
    result = run_cli(f"data.data_dir={synthetic_data_dir}", *QUICK, log_dir=log_dir)
    a_file = tmp_path / "a_file"
    assert_refused_before_anything(
        result, log_dir, f"paths.log_dir={log_dir} cannot be written (creating a file in {a_file}: {a_file} is a "
        f"file). Point paths.log_dir at a folder you can write, e.g. paths.log_dir=$HOME/logs."
    )  # fmt: skip


@pytest.mark.skipif(os.geteuid() == 0 and shutil.which("setpriv") is None, reason="root needs setpriv to drop rights")
def test_a_read_only_log_folder_is_refused(synthetic_data_dir):
    # Permission bits do not stop root: as root (CI), the command runs as user nobody (setpriv).
    top = Path(tempfile.mkdtemp(prefix="read-only-"))  # not under pytest's tmp_path, which is private to root
    try:
        top.chmod(0o755)
        (top / "logs").mkdir(mode=0o555)
        home = top / "home"  # writable for the user, for matplotlib's cache
        home.mkdir()
        command = cli_command(f"data.data_dir={synthetic_data_dir}", *QUICK, log_dir=top / "logs")
        if os.geteuid() == 0:
            os.chown(home, 65534, 65534)
            command = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", *command]
        env = cli_env(HOME=str(home), MPLCONFIGDIR=str(home))
        result = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
        logs = top / "logs"
        message = f"paths.log_dir={logs} cannot be written (creating a file in {logs}: Permission denied)"
        assert_refused_before_anything(result, logs, message)
    finally:
        shutil.rmtree(top)


def test_a_preset_setting_an_argument_the_other_model_lacks_names_it_and_the_fix():
    # experiment=fast sets model.net.batch_norm for the CNN; the MLP has no such argument.
    with pytest.raises(UsageError) as error:
        check_command_line("config", ["trainer.accelerator=cpu", "experiment=fast", "model=mlp"])
    message = str(error.value)
    for fragment in ("model.net.batch_norm is set", "mnist_ddp.models.networks.MLP does not take it",
                     "drop it with ~model.net.batch_norm"):  # fmt: skip
        assert fragment in message, message
    check_command_line("config", ["trainer.accelerator=cpu", "experiment=fast", "model=mlp", "~model.net.batch_norm"])


# --- the rendezvous address and the run directory ----------------------------------------------


def test_a_busy_master_port_and_an_unresolvable_master_addr_are_refused(synthetic_data_dir, tmp_path):
    # Real: something listens on the port (as another run's rendezvous or any server would).
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        result = run_cli(f"data.data_dir={synthetic_data_dir}", *QUICK, log_dir=tmp_path,
                         env={"MASTER_PORT": str(port)})  # fmt: skip
    assert_refused_before_anything(
        result, tmp_path, f"MASTER_PORT={port} is busy (something else is listening there): unset MASTER_PORT"
    )
    with pytest.raises(ConfigValueError, match=r"MASTER_ADDR=no-such-host.invalid does not resolve .*: unset it"):
        check_rendezvous_address({"MASTER_ADDR": "no-such-host.invalid"})
    with pytest.raises(ConfigValueError, match="MASTER_PORT=http is not a port number"):
        check_rendezvous_address({"MASTER_PORT": "http"})
    check_rendezvous_address({})  # unset: the OS picks a free port


def test_a_new_run_into_the_directory_of_an_earlier_run_is_refused(synthetic_run, tmp_path):
    log_dir, _ = synthetic_run
    (run,) = (log_dir / "runs").iterdir()
    before = {path: path.stat().st_mtime_ns for path in run.rglob("*")}
    result = run_cli(f"hydra.run.dir={run}", *QUICK, log_dir=tmp_path)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert result.stderr == (
        f"Error: hydra.run.dir={run} already holds a run: starting another there would overwrite its checkpoints "
        "and metrics. Start it in another directory (hydra.run.dir=<new folder>, or leave hydra.run.dir unset for "
        "a fresh one), or resume that run in place with ckpt_path=last and the same directory.\n"
    )
    assert {path: path.stat().st_mtime_ns for path in run.rglob("*")} == before, "nothing written"
    # Resuming in place is the way on; a sweep into an earlier sweep's folder is refused alike.
    check_output_dir(run, multirun=False, resume=True)
    with pytest.raises(ConfigValueError, match=f"hydra.sweep.dir={log_dir / 'runs'} already holds a run"):
        check_output_dir(log_dir / "runs", multirun=True, resume=False)
    check_output_dir(tmp_path / "new", multirun=False, resume=False)


def test_several_nodes_without_a_launcher_are_refused():
    with pytest.raises(ConfigValueError, match="trainer.num_nodes=2: a run on several machines needs a launcher"):
        check_command_line("config", ["trainer.accelerator=cpu", "trainer.num_nodes=2"])


def test_a_master_addr_of_another_machine_is_refused():
    # 192.0.2.1 (TEST-NET-1, RFC 5737) is never an address of this machine; nothing is sent to it.
    with pytest.raises(ConfigValueError, match="MASTER_ADDR=192.0.2.1 is not an address of this machine"):
        check_rendezvous_address({"MASTER_ADDR": "192.0.2.1"})
    check_rendezvous_address({"MASTER_ADDR": "127.0.0.1"})


def test_a_second_command_into_a_directory_in_use_is_refused(tmp_path):
    # A real second process holds the directory, as a command started a moment earlier would.
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD_RUN_DIR, str(tmp_path)], cwd=REPO, env=cli_env(), stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout.readline() == "holding\n"
        with pytest.raises(ConfigValueError, match=rf"{tmp_path} is in use by another run \(pid {holder.pid}\)"):
            with run_dir_lock(tmp_path):
                pass
    finally:
        holder.kill()
        holder.wait(timeout=30)
    with run_dir_lock(tmp_path):  # released when its holder ended, even by SIGKILL
        assert (tmp_path / ".lock").read_text() == str(os.getpid())


HOLD_RUN_DIR = """
import sys, time
from pathlib import Path
from mnist_ddp.distributed.launch import run_dir_lock
with run_dir_lock(Path(sys.argv[1])):
    print("holding", flush=True)
    time.sleep(600)
"""
