"""The DataLoader workers of a DDP process start from the loaders' forkserver, not forked from
the process (ddp_engine.data.loader_workers): a lock that a thread of the process holds when they
start cannot hold them up, a resume's batches come as the sampler deals them, and neither the
forkserver nor a worker outlives the process, even SIGKILLed.

One probe process (engine/tests/loader_start_probe.py) recreates a DDP process's conditions: gloo's
threads, the termination watchdog, a thread that allocates in a loop and one that holds a lock the
dataset needs from before the loaders are built until their last batch; the engine's training
loader resumed inside an epoch and its validation loader, 2 workers each. The same loaders with
the workers forked from the process, as they were started before, fail on the held lock: the
hang that a resume with 2 workers met in about one CI run of three, made certain.
"""

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import loader_start_probe as probe
import pytest
from harness import cli_env

from ddp_engine.data.sharding import ResumableDistributedSampler

pytestmark = pytest.mark.processes

#: The probe's program. It starts its loaders' forkserver first, as its loaders would (the same
#: call, with the modules they name), so that the forkserver imports them while the probe does.
PROBE = (
    "from ddp_engine.data.loader_workers import workers_context; workers_context('loader_start_probe'); "
    "import loader_start_probe; loader_start_probe.main()"
)
#: Seconds the probe may take to report a phase: its imports and the forkserver's, on a busy machine.
PHASE_TIMEOUT_S = 120
#: Seconds within which the forkserver and the workers end once their process is SIGKILLed.
END_TIMEOUT_S = 5


@pytest.fixture(scope="module")
def probe_run(tmp_path_factory):
    """The probe process (running until the module's last test kills it) and its phases' reports."""
    stderr = tmp_path_factory.mktemp("probe") / "stderr.txt"
    with open(stderr, "w") as errors:
        process = subprocess.Popen(
            [sys.executable, "-c", PROBE],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=errors, text=True, env=cli_env(),
        )  # fmt: skip
    lines = queue.Queue()
    threading.Thread(target=lambda: [*map(lines.put, process.stdout), lines.put("")], daemon=True).start()
    try:
        reports, deadline = {}, time.monotonic() + PHASE_TIMEOUT_S
        while "ready" not in reports:
            try:
                line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                pytest.fail(
                    f"The probe reported {sorted(reports)} and then nothing within {PHASE_TIMEOUT_S} s "
                    f"(a DataLoader worker hangs?):\n{stderr.read_text()[-3000:]}"
                )
            if not line:
                pytest.fail(f"The probe ended with status {process.wait()}:\n{stderr.read_text()[-3000:]}")
            reports[json.loads(line)["phase"]] = json.loads(line)
        yield process, reports
    finally:
        process.kill()
        process.wait()


def resumed_batches() -> list[list[int]]:
    """The batches of the probe's rank in the resumed epoch, as its sampler deals them."""
    sampler = ResumableDistributedSampler(
        range(probe.SAMPLES), num_replicas=probe.WORLD_SIZE, rank=probe.RANK, seed=probe.SHUFFLE_SEED
    )
    sampler.set_epoch(probe.EPOCH)
    sampler.start = probe.RESUME_AT
    order = list(sampler)
    size = probe.GLOBAL_BATCH // probe.WORLD_SIZE
    return [order[i : i + size] for i in range(0, len(order), size)]


def test_workers_forked_from_a_process_whose_thread_holds_a_lock_fail_and_the_engines_do_not(probe_run):
    _, reports = probe_run
    engine, forked = reports["engine"], reports["fork"]
    # A DDP process's threads: main, the watchdog, the allocating and the holding ones, gloo's.
    assert engine["native_threads"] >= 5, engine["native_threads"]
    assert engine["error"] is None, f"The engine's loaders, a thread holding a lock: {engine['error']}"
    assert engine["train"] == resumed_batches()
    assert engine["train"][0] != list(range(4)), "the batches of a resumed, shuffled epoch"
    # Rank 1 of 2, unpadded: samples 97, 99, ..., in batches of 4.
    val = list(range(probe.SAMPLES + 1, probe.SAMPLES + probe.VAL_SAMPLES, 2))
    assert engine["val"] == [val[:4], val[4:]]
    # Forked from the process, the same workers wait for the lock held at their fork.
    assert forked["train"] == [] and forked["val"] == []
    assert f"waited {probe.WAIT_S:g} s for a lock that no thread of it holds" in forked["error"], forked["error"]
    print(f"Resumed epoch and validation: {engine['seconds']:.2f} s; forked: failed after {forked['seconds']:.1f} s")


def test_the_workers_come_from_one_forkserver_which_ends_with_its_process_and_they_with_it(probe_run):
    process, reports = probe_run
    tree = reports["engine"]["processes"]
    forkservers = [p for p in tree if p["title"] == f"ddp_engine DataLoader forkserver of pid {process.pid}"]
    workers = [p for p in tree if p["title"] == f"ddp_engine DataLoader worker of pid {process.pid}"]
    assert [p["ppid"] for p in forkservers] == [process.pid], tree
    # The training loader's 2 and the validation loader's 2 (persistent), none forked from the process.
    assert [p["ppid"] for p in workers] == [forkservers[0]["pid"]] * 4, tree
    others = [p for p in tree if p not in forkservers + workers]
    assert all("multiprocessing.resource_tracker" in p["title"] for p in others), others  # Python's, this one's own
    # Ctrl-C and a closed terminal reach the whole process group: the process answers them.
    for signum in (signal.SIGINT, signal.SIGHUP):
        for helper in forkservers + workers:
            os.kill(helper["pid"], signum)
    time.sleep(0.5)
    assert [p for p in forkservers + workers if not running(p)] == [], "ended by SIGINT or SIGHUP"

    process.kill()
    process.wait()
    deadline = time.monotonic() + END_TIMEOUT_S
    while (left := [p for p in tree if running(p)]) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert left == [], f"Still running {END_TIMEOUT_S} s after their process was SIGKILLed: {left}"


def running(process: dict) -> bool:
    """Whether the process of a probe's report still runs: its pid has its command line (a zombie's is empty)."""
    try:
        return (
            Path(f"/proc/{process['pid']}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
            == process["title"]
        )
    except OSError:
        return False
