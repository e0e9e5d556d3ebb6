"""Several jobs of a sweep at once on one machine, each a single run of the same command in a process
of its own (``python -m <project>.train <the job's overrides> hydra.run.dir=<sweep>/<job>``), confined
to its slot (:mod:`ddp_engine.launch.job_slots`): its own GPUs, or its own CPU cores.

Each job's process is a whole run: it checks its command line, supervises its DDP processes with
its own rendezvous port and writes its ``metrics.json``. So everything a single run guarantees
holds per job: a failing job ends alone (the others go on), a stopped job can be resumed. Here:

- at most ``at_a_time`` jobs run, in job order, each when its slot is free;
- each job's output lines reach the console prefixed ``[#<job>]``, and a line says when it ends;
- SIGINT, SIGTERM or SIGHUP to the sweep's command is passed to every running job, which stops
  its processes and records itself as stopped; no job starts after it, and the command exits with
  128 + the signal once every job's process has ended;
- a job's process ends with the sweep's command, however that dies (:mod:`ddp_engine.core.lifetime`).
"""

import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ddp_engine.core.files import write_json
from ddp_engine.core.lifetime import STOP_SIGNALS
from ddp_engine.core.run_dir import METRICS_FILE, run_status
from ddp_engine.launch.job_slots import DevicePool, Slot

log = logging.getLogger(__name__)

#: Set in each job's environment: the pid of the sweep's command, which the job ends with.
SWEEP_ENV = "DDP_ENGINE_SWEEP_PID"
#: The line Hydra ends a failed job's output with, after the error: not the line that says what failed.
HYDRA_HINT = "Set the environment variable HYDRA_FULL_ERROR=1"


@dataclass
class JobProcess:
    """One job of the sweep, to run as its own process.

    Attributes:
        index: its job number. job_dir: its run directory. overrides: its overrides.
        command: its command line (the sweep's command, with the job's overrides and ``hydra.run.dir``).
        devices: the GPUs, or CPU cores, it takes from the pool. cuda: whether they are GPUs.
        processes: its DDP processes (for the threads per process on CPU).
    """

    index: int
    job_dir: Path
    overrides: list[str]
    command: list[str]
    devices: int
    cuda: bool
    processes: int
    slot: Slot = field(default_factory=Slot)
    process: subprocess.Popen | None = None
    relay: threading.Thread | None = None
    last_line: str = ""
    stop_deadline: float | None = None


class ParallelJobs:
    """Runs ``jobs`` at most ``at_a_time`` at once, each on devices taken from ``pool``.

    Args:
        jobs: the jobs, in job order.
        pool: the machine's GPUs or CPU cores.
        at_a_time: the most jobs running at once.
        grace: seconds a stopped job has to end before its process group is killed (its own
            supervisor's ``launcher.shutdown_timeout`` plus a margin).
        stop_hint: the line logged after a signal stopped the sweep (how to continue it).
    """

    def __init__(
        self, jobs: Sequence[JobProcess], pool: DevicePool, at_a_time: int, grace: float, stop_hint: str
    ) -> None:
        self.pending, self.pool, self.at_a_time, self.grace = deque(jobs), pool, at_a_time, grace
        self.stop_hint = stop_hint
        self.running: list[JobProcess] = []
        self.exit_status: dict[int, int] = {}
        self.stopped_by: int | None = None
        self.console = threading.Lock()

    def run(self) -> dict[int, int]:
        """Run every job (or, after a stop signal, those already running); returns each job's exit status.

        Raises:
            SystemExit: 128 + the signal, once every running job has ended, when one stopped the sweep.
        """
        previous = {signum: signal.signal(signum, self._stop) for signum in STOP_SIGNALS}
        try:
            while self.running or (self.pending and self.stopped_by is None):
                self._start_what_fits()
                self._pass_on_the_stop()
                self._reap()
                time.sleep(0.1)
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)
        if self.stopped_by is not None:
            log.warning(self.stop_hint)
            sys.exit(128 + self.stopped_by)
        return self.exit_status

    def _start_what_fits(self) -> None:
        while self.pending and self.stopped_by is None and len(self.running) < self.at_a_time:
            job = self.pending[0]
            devices = self.pool.take(job.devices)
            if devices is None:
                return
            self.pending.popleft()
            self._start(job, devices)

    def _start(self, job: JobProcess, devices: tuple) -> None:
        if job.cuda:
            job.slot = Slot(gpus=devices)
        else:
            job.slot = Slot(cores=devices, threads=max(1, len(devices) // job.processes))
        env = {**os.environ, **job.slot.environment(), SWEEP_ENV: str(os.getpid())}
        # Its own session: a Ctrl-C at the terminal reaches this process only, which passes it on once.
        job.process = subprocess.Popen(
            job.command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
        )
        if job.slot.cores:
            # Before the job starts its DDP processes (seconds from now, after its imports), which inherit it.
            os.sched_setaffinity(job.process.pid, job.slot.cores)
        where = f"GPUs {','.join(job.slot.gpus)}" if job.cuda else f"CPU cores {','.join(map(str, job.slot.cores))}"
        log.info(f"\t#{job.index} started on {where}: {job.job_dir}")
        job.relay = threading.Thread(target=self._relay, args=(job,), daemon=True)
        job.relay.start()
        self.running.append(job)

    def _relay(self, job: JobProcess) -> None:
        """Pass the job's output lines to the console, each prefixed with its job number."""
        for line in job.process.stdout:
            if line.strip() and not line.startswith(HYDRA_HINT):
                job.last_line = line.strip()
            with self.console:
                sys.stdout.write(f"[#{job.index}] {line}")
                sys.stdout.flush()

    def _reap(self) -> None:
        for job in [job for job in self.running if job.process.poll() is not None]:
            self.running.remove(job)
            self.pool.give_back(job.slot.gpus or job.slot.cores)
            job.relay.join(timeout=5)  # its last lines first
            self.exit_status[job.index] = job.process.returncode
            if job.process.returncode != 0 and run_status(job.job_dir) not in ("failed", "stopped"):
                write_json(job.job_dir / METRICS_FILE, self._unrecorded(job))
            done = len(self.exit_status)
            log.info(f"\t#{job.index} {run_status(job.job_dir) or 'ended'} (exit status {job.process.returncode}), "
                     f"{done} job(s) done: {job.job_dir}")  # fmt: skip

    def _unrecorded(self, job: "JobProcess") -> dict:
        """The record of a job whose command ended before its run recorded itself: stopped, when the
        sweep passed it a stop signal or a stop signal ended it (its command was still checking its
        values, or starting its processes: the continued sweep starts it again); else failed (a
        refused command line, a crash), with its last line, which the summary shows."""
        code = job.process.returncode
        by_signal = next((s for s in STOP_SIGNALS if code in (128 + s, -s)), None)
        if self.stopped_by is not None or by_signal is not None:
            name = signal.Signals(self.stopped_by or by_signal).name
            return {"status": "stopped", "signal": name, "overrides": job.overrides}
        error = f"its command exited with status {code}: {job.last_line}"
        return {"status": "failed", "error": error, "overrides": job.overrides}

    def _stop(self, signum: int, frame: object) -> None:
        """Record the stop signal; the loop of :meth:`run` passes it on (:meth:`_pass_on_the_stop`).

        Only recorded here: the handler runs wherever the main thread is, possibly inside
        :meth:`_start` with a job's process started and not yet listed as running."""
        if self.stopped_by is None:
            self.stopped_by = signum

    def _pass_on_the_stop(self) -> None:
        """Once a stop signal came: pass it to each running job, once, and kill the process group
        of a job still running ``grace`` seconds later."""
        if self.stopped_by is None:
            return
        waiting = [job for job in self.running if job.stop_deadline is None]
        if waiting:
            name = signal.Signals(self.stopped_by).name
            log.warning(f"{name}: stopping the {len(waiting)} running job(s); no other starts.")
        for job in waiting:
            job.process.send_signal(self.stopped_by)
            job.stop_deadline = time.time() + self.grace
        for job in self.running:
            if job.process.poll() is None and time.time() > job.stop_deadline:
                log.error(f"#{job.index} did not stop within {self.grace:.0f} s: killed")
                os.killpg(job.process.pid, signal.SIGKILL)
                job.stop_deadline = float("inf")  # killed once
