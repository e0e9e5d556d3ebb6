"""The engine's sweep launcher (``hydra/launcher=resumable``) runs the sweep of any Hydra app, one
with no engine config at all (``plain_app/``: no ``trainer``, no ``launcher``, no project): its
jobs run side by side, one process each, or one after another in the command's process, and a
failing job ends alone. Through the app's real command line."""

import json
import os
import subprocess
import sys

import pytest
from harness import HERE, cli_env

pytestmark = pytest.mark.processes

APP = HERE / "plain_app" / "app.py"


def sweep(tmp_path, *overrides: str) -> subprocess.CompletedProcess:
    command = [sys.executable, str(APP), "-m", "hydra/launcher=resumable", f"hydra.sweep.dir={tmp_path}", *overrides]
    return subprocess.run(command, cwd=tmp_path, env=cli_env(), capture_output=True, text=True, timeout=120)


def jobs(tmp_path) -> dict[int, dict]:
    return {int(job.name): json.loads((job / "job.json").read_text())
            for job in tmp_path.iterdir() if (job / "job.json").is_file()}  # fmt: skip


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="two jobs side by side need two cores")
def test_an_apps_jobs_without_a_trainer_run_side_by_side_one_process_each(tmp_path):
    result = sweep(tmp_path, "x=1,2", "seconds=3")
    assert result.returncode == 0, result.stderr[-3000:]
    ran = jobs(tmp_path)
    assert sorted(record["x"] for record in ran.values()) == [1, 2]
    first, second = ran[0], ran[1]
    assert first["pid"] != second["pid"]
    # Side by side: each started before the other ended.
    assert first["started"] < second["ended"] and second["started"] < first["ended"], ran
    assert "2 jobs at a time" in result.stdout + result.stderr


def test_an_apps_jobs_run_in_order_in_the_commands_process_with_n_jobs_1(tmp_path):
    result = sweep(tmp_path, "x=1,2,3", "hydra.launcher.n_jobs=1")
    assert result.returncode == 0, result.stderr[-3000:]
    ran = jobs(tmp_path)
    assert [ran[index]["x"] for index in range(3)] == [1, 2, 3]
    assert len({record["pid"] for record in ran.values()}) == 1
    assert ran[0]["ended"] <= ran[1]["started"] and ran[1]["ended"] <= ran[2]["started"]


def test_a_failing_job_of_an_app_ends_alone(tmp_path):
    result = sweep(tmp_path, "x=1,2,3", "fail_on=2")
    assert result.returncode == 0, result.stderr[-3000:]
    ran = jobs(tmp_path)
    assert sorted(ran) == [0, 2] and [ran[0]["x"], ran[2]["x"]] == [1, 3], result.stderr[-3000:]
    failed = json.loads((tmp_path / "1" / "metrics.json").read_text())
    assert failed["status"] == "failed" and "x=2" in failed["overrides"], failed
    assert "job x=2 fails as asked" in failed["error"]
