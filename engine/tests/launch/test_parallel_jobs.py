"""A sweep's jobs at once (``ddp_engine.launch.parallel_jobs.ParallelJobs``), with real child
processes in place of the jobs' commands: a stop signal reaches every job, also one whose process
has just been started when the signal comes."""

import json
import os
import signal
import sys
import time

import pytest

from ddp_engine.launch.job_slots import DevicePool
from ddp_engine.launch.parallel_jobs import JobProcess, ParallelJobs

pytestmark = pytest.mark.processes

#: A job's command: ends by SIGTERM's default action (status -15), or with 0 after 30 s without it.
JOB = "import time; time.sleep(30)"


def test_a_stop_that_comes_while_a_job_starts_reaches_that_job_too(tmp_path, monkeypatch):
    jobs = [
        JobProcess(index=index, job_dir=tmp_path / str(index), overrides=[], command=[sys.executable, "-c", JOB],
                   devices=1, cuda=False, processes=1)
        for index in range(2)
    ]  # fmt: skip
    for job in jobs:
        job.job_dir.mkdir()
    pin = os.sched_setaffinity

    def pin_then_stop(pid: int, cores) -> None:
        # The sweep's command gets SIGTERM as it pins job 1: the job's process runs, and the handler
        # runs at once, here, before the job is listed as running.
        pin(pid, cores)
        if jobs[1].process is not None and pid == jobs[1].process.pid:
            os.kill(os.getpid(), signal.SIGTERM)

    monkeypatch.setattr(os, "sched_setaffinity", pin_then_stop)
    core = min(os.sched_getaffinity(0))
    sweep = ParallelJobs(jobs, DevicePool([core, core]), at_a_time=2, grace=10, stop_hint="continue")
    started = time.monotonic()
    with pytest.raises(SystemExit) as stopped:
        sweep.run()
    assert stopped.value.code == 128 + signal.SIGTERM
    assert sweep.exit_status == {0: -signal.SIGTERM, 1: -signal.SIGTERM}, "each job ended by the stop"
    assert time.monotonic() - started < 10, "neither job ran on to its end"
    for job in jobs:
        assert json.loads((job.job_dir / "metrics.json").read_text())["status"] == "stopped"
