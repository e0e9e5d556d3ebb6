"""The supervisor's calls in a process forked from the job's forkserver (``run_in_forkserver``): the
answer, a refusal and a process that dies, each as the supervisor sees it. One real supervisor-like
process per test run, whose forkserver preloads nothing heavy."""

import json
import subprocess
import sys

import pytest
from harness import cli_env

pytestmark = pytest.mark.processes

SUPERVISOR = """
import json, os
from ddp_engine.core.errors import ConfigValueError
from ddp_engine.launch.supervisor import preload_workers, run_in_forkserver

preload_workers("json")
os.environ["SET_AFTER_THE_FORKSERVER_STARTED"] = "yes"
seen = {
    "supervisor": os.getpid(),
    "child": run_in_forkserver("os:getpid"),
    "child's parent": run_in_forkserver("os:getppid"),
    "environment": run_in_forkserver("os:getenv", "SET_AFTER_THE_FORKSERVER_STARTED"),
}
for name, call in (("refusal", ("ddp_engine.distributed.layout_rules:parse_cpu_devices", 0)),
                   ("exit", ("os:_exit", 3)),
                   ("unpicklable", ("threading:Lock",))):
    try:
        run_in_forkserver(*call)
    except (ConfigValueError, RuntimeError) as error:
        seen[name] = [type(error).__name__, str(error)]
print(json.dumps(seen))
"""


def test_a_call_answers_from_a_child_of_the_forkserver_and_its_failures_arrive_as_one_error():
    result = subprocess.run([sys.executable, "-c", SUPERVISOR], env=cli_env(), capture_output=True, text=True,
                            timeout=120)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    seen = json.loads(result.stdout.splitlines()[-1])
    # Forked from the forkserver (the supervisor's child), in the supervisor's environment of now.
    assert seen["child"] not in (seen["supervisor"], seen["child's parent"])
    assert seen["child's parent"] != seen["supervisor"]
    assert seen["environment"] == "yes"
    # The refusal as the check raised it: its class and its one line.
    assert seen["refusal"] == ["ConfigValueError", "trainer.devices=0 is not a positive process count on CPU."]
    assert seen["exit"][0] == "RuntimeError" and "os:_exit ended without an answer (exit code 3)" in seen["exit"][1]
    assert seen["unpicklable"][0] == "RuntimeError" and "cannot pickle" in seen["unpicklable"][1]


#: A supervisor whose forkserver ends while it preloads (its module exits the process after 2 s),
#: with the call already waiting in its socket's queue.
ENDED = """
import os, pathlib, sys
from ddp_engine.launch.supervisor import ForkserverUnavailable, preload_workers, run_in_forkserver

folder = pathlib.Path(sys.argv[1])
(folder / "ends_the_forkserver.py").write_text("import os, time\\ntime.sleep(2)\\nos._exit(9)\\n")
sys.path.insert(0, str(folder))
os.environ["PYTHONPATH"] = os.pathsep.join([str(folder), os.environ.get("PYTHONPATH", "")])
preload_workers("ends_the_forkserver")
try:
    run_in_forkserver("os:getpid")
except ForkserverUnavailable as error:
    print(error)
"""


def test_a_forkserver_that_ends_before_it_forks_is_unavailable(tmp_path):
    # The command then checks in its own process, and the launch starts another forkserver.
    result = subprocess.run([sys.executable, "-c", ENDED, str(tmp_path)], env=cli_env(), capture_output=True,
                            text=True, timeout=120)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip() == "The job's forkserver ended before it forked the process.", result.stdout
