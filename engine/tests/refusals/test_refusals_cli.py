"""Refusals through the real command line of the test tasks, as one line before any process
launches and before any run directory exists: a launcher that started another number of processes
(torchrun, for real), a log folder that cannot be written, a typo (found before torch is even
imported), a global batch that does not split.

What each refusal says, GPUs this machine does not have, SyncBatchNorm and NCCL on CPU and the
rendezvous address included, is checked in process: test_refusals.py.
"""

import os
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
from harness import HERE, cli_command, cli_env, processes_mentioning, run_cli, torchrun
from runs import TRAIN

pytestmark = pytest.mark.processes

QUICK = ("trainer.accelerator=cpu", "trainer.devices=2", "trainer.max_epochs=1", "data.global_batch_size=64")


def assert_refused_before_anything(result, log_dir: Path, message: str) -> None:
    assert result.returncode == 1, result.stdout[-2000:] + result.stderr[-3000:]
    assert result.stderr.startswith(f"Error: {message}"), result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.stderr
    assert not (log_dir / "runs").exists(), "no run directory, no process"


def test_num_nodes_that_torchrun_did_not_start_are_refused_in_every_process(sensor_data, tmp_path):
    # torchrun stops the other processes within its monitor interval (0.1 s) of the first one's exit,
    # and a refused process exits at once: 20 s give each process the time to refuse on its own, also
    # on a loaded machine, where the second may still be importing when the first exits.
    result = torchrun(
        TRAIN, "--standalone", "--nproc-per-node=2", "--monitor-interval=20",
        overrides=(*sensor_data, *QUICK, "trainer.num_nodes=2"), log_dir=tmp_path, timeout=300,
    )  # fmt: skip
    assert result.returncode != 0
    # Lightning's own sentence (TorchElasticEnvironment) names the settings; the engine adds the fix.
    fix = (
        "Set trainer.num_nodes and trainer.devices to the launcher's nodes and processes per node "
        "(torchrun --nnodes / --nproc-per-node)."
    )
    refusals = re.findall(
        rf"Error: [^\n]*devices=2[^\n]*num_nodes=2[^\n]*{re.escape(fix)}", result.stdout + result.stderr
    )
    assert len(refusals) == 2, "each of the 2 processes refuses"
    assert not (tmp_path / "runs").exists(), "no run directory"


@pytest.mark.skipif(os.geteuid() == 0 and shutil.which("setpriv") is None, reason="root needs setpriv to drop rights")
def test_a_read_only_log_folder_is_refused(sensor_data):
    # Permission bits do not stop root: as root (CI), the command runs as user nobody (setpriv).
    top = Path(tempfile.mkdtemp(prefix="read-only-"))  # not under pytest's tmp_path, which is private to root
    try:
        top.chmod(0o755)
        (top / "logs").mkdir(mode=0o555)
        home = top / "home"  # writable for the user, for matplotlib's cache
        home.mkdir()
        command = cli_command(TRAIN, *sensor_data, *QUICK, log_dir=top / "logs")
        if os.geteuid() == 0:
            os.chown(home, 65534, 65534)
            command = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", *command]
        env = cli_env(HOME=str(home), MPLCONFIGDIR=str(home))
        result = subprocess.run(command, cwd=HERE, env=env, capture_output=True, text=True, timeout=120)
        logs = top / "logs"
        message = f"paths.log_dir={logs} cannot be written (creating a file in {logs}: Permission denied)"
        assert_refused_before_anything(result, logs, message)
    finally:
        shutil.rmtree(top)


# Mostly the image task's commands: its data set's keys are typed by a schema, which Hydra checks
# alone. A DataModule without one, such as the regression's, is checked against its class's
# signature, read from its source and its base class's (its __init__ passes **kwargs on).
@pytest.mark.parametrize(
    ("module", "typos", "error"),
    [
        ("vision_task.train", ["data.global_batch_sze=64"], "Unknown key data.global_batch_sze"),
        ("sensor_task.eval", ["trainer.devics=2"], "Unknown key trainer.devics"),
        ("sensor_task.train", ["data.pth=windows.npz"], "Unknown key data.pth"),
        # An argument of an open node's class that the config does not set: read from the class's
        # source (torch.optim's, torch not imported), added with a +.
        ("vision_task.train", ["data.root=/x", "model.optimizer.betas=[0.8,0.9]"],
         "model.optimizer.betas is an argument of torch.optim.AdamW that the config does not set: add it with "
         "+model.optimizer.betas=..."),
        # The parameters are the task's to pass, never the config's: no + for them.
        ("vision_task.train", ["data.root=/x", "model.optimizer.params=1"],
         "Unknown key model.optimizer.params (torch.optim.AdamW takes lr, betas, eps, weight_decay, amsgrad, "
         "maximize, foreach, capturable, differentiable, fused)."),
        ("vision_task.train", ["data.root=/x", "model.optimizer.betaz=1"],
         "Unknown key model.optimizer.betaz (torch.optim.AdamW takes lr, betas, eps, weight_decay, amsgrad, "
         "maximize, foreach, capturable, differentiable, fused). Did you mean +model.optimizer.betas?"),
        # Paths that name nothing need no torch either (config/command_line.check_paths): a
        # checkpoint (also through ${hydra:...}, resolved as in the job), a prediction's input, an
        # export's output that exists. {files} holds a .ckpt and a .onnx file.
        ("vision_task.eval", ["ckpt_path=/nonexistent/last.ckpt", "data.root=/x"],
         "ckpt_path=/nonexistent/last.ckpt: no such file."),
        ("vision_task.eval", ["ckpt_path=${{hydra:runtime.cwd}}/no.ckpt", "data.root=/x"],
         f"ckpt_path={HERE}/no.ckpt: no such file."),
        ("vision_task.predict", ["ckpt_path={files}/last.ckpt", "input={files}/none", "data.root=/x"],
         "input={files}/none: no such"),
        ("vision_task.export", ["ckpt_path={files}/last.ckpt", "format=onnx", "data.root=/x"],
         "output={files}/last.onnx exists"),
    ],
)  # fmt: skip
def test_a_typo_is_refused_before_torch_is_imported(module, typos, error, tmp_path):
    # The keys are checked with Hydra alone (config/compose.py): torch and Lightning take seconds.
    files = tmp_path / "files"
    files.mkdir()
    for name in ("last.ckpt", "last.onnx"):  # their contents are read only after torch is imported
        (files / name).write_bytes(b"not read")
    assert_refused_without_torch(module, [typo.format(files=files) for typo in typos], error.format(files=files),
                                 tmp_path / "logs")  # fmt: skip
    assert sorted(path.name for path in files.iterdir()) == ["last.ckpt", "last.onnx"]


def assert_refused_without_torch(module: str, overrides: list[str], message: str, log_dir: Path) -> None:
    """``python -m <module>`` with ``overrides`` exits with status 1 and the one line ``Error: <message>...``,
    writes nothing under ``log_dir``, and never imports torch or Lightning (``python -X importtime``)."""
    command = cli_command(module, *overrides, log_dir=log_dir)
    command[1:1] = ["-X", "importtime"]  # Python lists every module it imports on stderr
    result = subprocess.run(command, cwd=HERE, env=cli_env(), capture_output=True, text=True, timeout=120)
    imported = {
        line.rsplit("|", 1)[-1].strip() for line in result.stderr.splitlines() if line.startswith("import time:")
    }
    assert "hydra" in imported and "torch" not in imported and "lightning" not in imported
    errors = [line for line in result.stderr.splitlines() if not line.startswith("import time:")]
    assert result.returncode == 1 and errors[0].startswith(f"Error: {message}"), errors
    assert len(errors) == 1 and not log_dir.exists(), "one line, nothing written"


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        # torch's own words (torch.optim.AdamW refuses it so): config/test_early_checks.py holds each rule to torch.
        (["model.optimizer.lr=-1"],
         "model.optimizer: Invalid learning rate: -1 (its arguments: model.optimizer.lr=-1)."),
        (["trainer.accelerator=cpu", "trainer.devices=0"], "trainer.devices=0 is not a positive process count on CPU."),
        (["trainer.accelerator=cpu", "trainer.devices=2", "data.global_batch_size=127"],
         "data.global_batch_size=127 does not split evenly over world_size=2 processes x "
         "trainer.accumulate_grad_batches=1: it must be a multiple of 2. Use data.global_batch_size=126 or 128."),
        (["trainer.num_nodes=0"], "trainer.num_nodes=0 must be at least 1."),
    ],
)  # fmt: skip
def test_a_value_that_needs_no_torch_to_refuse_is_refused_before_torch_is_imported(overrides, message, tmp_path):
    # The image task: its data set's keys are typed by a schema, so composing imports no torch either.
    assert_refused_without_torch("vision_task.train", ["data.root=/x", *overrides], message, tmp_path / "logs")


# --- a refused command line -------------------------------------------------------------------


BATCH_SPLIT = (
    "data.global_batch_size=63",
    "data.global_batch_size=63 does not split evenly over world_size=2 processes x "
    "trainer.accumulate_grad_batches=1: it must be a multiple of 2. Use data.global_batch_size=62 or 64.",
)


def test_a_bad_command_line_is_one_line_before_any_process_or_directory(sensor_data, tmp_path):
    # The command's contract; each refusal's message is checked in process (config/test_composed_config.py).
    override, message = BATCH_SPLIT
    result = run_cli(TRAIN, *sensor_data, "trainer.accelerator=cpu", override, log_dir=tmp_path)
    assert result.returncode == 1
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith(f"Error: {message}")
    assert list(tmp_path.iterdir()) == []
    # The workers' forkserver, started once the keys were right (its title in ps holds the
    # command's log folder), ends with the command: by the kernel's SIGTERM on its parent's death
    # while it imports, by its own check of its parent once it serves; milliseconds later.
    deadline = time.time() + 1
    while (left := processes_mentioning(str(tmp_path))) and time.time() < deadline:
        time.sleep(0.01)
    assert left == [], "no process left behind"
