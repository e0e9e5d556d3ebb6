"""A sweep stopped by SIGTERM and continued by the same command with its ``hydra.sweep.dir``, through
the real command line (1 gloo process per job, the deterministic configuration of test_resume.py):
the completed job is kept untouched, the stopped one resumes from its ``last.ckpt`` to the
parameters of its uninterrupted run, the one never started runs, and the summary has all three. A
changed sweep into that directory is refused before anything runs, naming what changed. The plan
per job (``mnist_ddp.launch.sweep_launcher``) is also tested on directories made here."""

import csv
import json
import os
import signal
import subprocess
import time

import pytest
import torch
from helpers import DETERMINISTIC, REPO, cli_command, cli_env, processes_mentioning, run_cli

from mnist_ddp.config.command_line import check_command_line
from mnist_ddp.core.errors import ConfigValueError
from mnist_ddp.launch.sweep_launcher import JobPlan, move_aside, plan_job

pytestmark = pytest.mark.processes

#: last.ckpt every 5 optimizer steps; from step 12 (after the checkpoint of step 10) each step of
#: global rank 0 waits 0.1 s and its job's directory gets the marker ``paused``.
SWEEP = (
    *DETERMINISTIC, "trainer.devices=1", "callbacks.last_checkpoint.train_time_interval=null",
    "callbacks.last_checkpoint.every_n_train_steps=5", "+callbacks.pause._target_=probes.PauseAfterStep",
    "+callbacks.pause.step=12", "+callbacks.pause.marker=${paths.output_dir}/paused", "seed=1,2,3",
)  # fmt: skip


def params(job_dir):
    return torch.load(job_dir / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]


def snapshot(folder):
    """Every file under ``folder``, with its modification time and bytes."""
    return {path: (path.stat().st_mtime_ns, path.read_bytes()) for path in folder.rglob("*") if path.is_file()}


def test_a_stopped_sweep_continues_with_the_same_command(noisy_data_dir, tmp_path):
    log_dir, sweep = tmp_path / "logs", tmp_path / "logs" / "sweep"
    overrides = (f"data.data_dir={noisy_data_dir}", *SWEEP, f"hydra.sweep.dir={sweep}")
    command = cli_command("-m", *overrides, log_dir=log_dir)
    args = command[3:]  # the command line's arguments: -m, paths.log_dir, the overrides
    run = subprocess.Popen(command, cwd=REPO, env=cli_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True, start_new_session=True)  # fmt: skip
    try:
        deadline = time.time() + 300
        while not (sweep / "1" / "paused").exists() and run.poll() is None and time.time() < deadline:
            time.sleep(0.05)
        assert (sweep / "1" / "paused").exists(), "job 1 never reached step 12"
        os.kill(run.pid, signal.SIGTERM)
        output = run.communicate(timeout=60)[0]
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
    assert run.returncode == 128 + signal.SIGTERM, output[-3000:]
    assert (
        output.strip()
        .splitlines()[-1]
        .endswith(
            f"Continue the sweep with the same command and hydra.sweep.dir={sweep}: the completed jobs are kept, this "
            "one resumes from its last.ckpt, the others run."
        )
    )
    assert processes_mentioning(str(log_dir)) == []
    assert json.loads((sweep / "0" / "metrics.json").read_text())["status"] == "completed"
    assert json.loads((sweep / "1" / "metrics.json").read_text())["status"] == "stopped"
    assert not (sweep / "2").exists(), "job 2 never started"
    kept = snapshot(sweep / "0")

    # Another sweep into that directory, with or without ckpt_path=last: refused before anything runs.
    with pytest.raises(ConfigValueError, match=r"holds another sweep: this command sets seed=4,5,6, that sweep set "
                                               r"seed=1,2,3\. Its results would be reported"):  # fmt: skip
        check_command_line("config", [arg if arg != "seed=1,2,3" else "seed=4,5,6" for arg in args])
    with pytest.raises(ConfigValueError, match="ckpt_path=last: a sweep is continued without it"):
        check_command_line("config", [*args, "ckpt_path=last"])
    assert snapshot(sweep / "0") == kept

    # The same command again continues the sweep.
    again = run_cli("-m", *overrides, log_dir=log_dir)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert "#0 completed in an earlier run of this sweep" in again.stdout
    assert f"#1 resumes in place from {sweep / '1' / 'checkpoints' / 'last.ckpt'}" in again.stdout
    assert snapshot(sweep / "0") == kept, "the completed job's files are untouched"
    resumed = torch.load(sweep / "1" / "checkpoints" / "last.ckpt", weights_only=True)
    assert resumed["global_step"] == 2 * 21
    reference = run_cli(f"data.data_dir={noisy_data_dir}", *SWEEP[:-1], "seed=2", log_dir=tmp_path / "reference")
    assert reference.returncode == 0, reference.stdout[-3000:] + reference.stderr[-3000:]
    (reference_dir,) = (tmp_path / "reference" / "runs").iterdir()
    for key, value in params(reference_dir).items():
        assert torch.equal(params(sweep / "1")[key], value), key
    rows = list(csv.DictReader((sweep / "summary.csv").open()))
    assert [(row["job"], row["status"]) for row in rows] == [("0", "completed"), ("1", "resumed"), ("2", "completed")]
    assert [row["overrides"].split()[-1] for row in rows] == ["seed=1", "seed=2", "seed=3"]
    for row in rows:
        assert row["test/acc"] == f"{json.loads((sweep / row['job'] / 'metrics.json').read_text())['test/acc']:.4f}"


def test_each_job_of_a_continued_sweep_is_planned_by_its_directory(tmp_path):
    def job(name, status=None, checkpoint=False):
        folder = tmp_path / name
        folder.mkdir()
        if status:
            (folder / "metrics.json").write_text(json.dumps({"status": status}))
        if checkpoint:
            (folder / "checkpoints").mkdir()
            (folder / "checkpoints" / "last.ckpt").write_bytes(b"state")
        return folder

    assert plan_job(job("completed", "completed", checkpoint=True), rerun_failed=True) is JobPlan.KEEP
    failed = job("failed", "failed", checkpoint=True)
    assert plan_job(failed, rerun_failed=False) is JobPlan.KEEP
    assert plan_job(failed, rerun_failed=True) is JobPlan.RESUME
    assert plan_job(job("stopped", "stopped", checkpoint=True), rerun_failed=False) is JobPlan.RESUME
    assert plan_job(job("killed", checkpoint=True), rerun_failed=False) is JobPlan.RESUME, "SIGKILL: no metrics.json"
    early = job("early", "stopped")
    assert plan_job(early, rerun_failed=False) is JobPlan.RESTART
    assert plan_job(tmp_path / "never", rerun_failed=False) is JobPlan.RUN
    # A job stopped before its first checkpoint starts again in an empty directory; what it wrote is kept.
    assert move_aside(early) == tmp_path / ".stopped" / "early.0" and not early.exists()
    early.mkdir()
    assert move_aside(early) == tmp_path / ".stopped" / "early.1"
    assert json.loads((tmp_path / ".stopped" / "early.0" / "metrics.json").read_text()) == {"status": "stopped"}
