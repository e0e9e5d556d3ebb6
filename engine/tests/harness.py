"""What the engine's tests and a project's share to run commands as a user would and to read what
a run leaves: the environment of a command (:func:`cli_env`), a command under torchrun, a
simulated SLURM job or a Kubeflow TrainJob's pods run here, TensorBoard's scalars as its own
readers show them, the ranks in a log, live processes from /proc. Task-agnostic: a command is
``python -m <package>.<command>`` of whichever task a test runs.

Test modules import them with ``from harness import ...`` (engine/tests is on pytest's
``pythonpath`` and on every command's PYTHONPATH).
"""

import os
import re
import signal
import socket
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import torch
from tensorboard.backend.event_processing import plugin_event_accumulator
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.util import tensor_util

#: engine/tests: the test project (``sensor_task``) and the test-only callbacks (``probes``).
HERE = Path(__file__).resolve().parent


#: Variables through which a launcher (torchrun, SLURM, Lightning) tells a process its place in a job.
LAUNCHER_VARIABLES = re.compile(
    r"MASTER_ADDR|MASTER_PORT|RANK|LOCAL_RANK|NODE_RANK|GROUP_RANK|WORLD_SIZE|TORCHELASTIC_\w+|SLURM_\w+"
)


def cli_env(*paths: Path, **extra: str) -> dict[str, str]:
    """The environment for a CLI run: this one without launcher variables (a command starts as from
    a fresh shell, whatever a test left behind), plus ``extra``, and engine/tests (then ``paths``) on
    PYTHONPATH, so that a run can load the test project and the test-only callbacks of
    ``probes.py`` through Hydra overrides (``+callbacks.x._target_=probes...``)."""
    path = os.pathsep.join(filter(None, [str(HERE), *map(str, paths), os.environ.get("PYTHONPATH")]))
    clean = {key: value for key, value in os.environ.items() if not LAUNCHER_VARIABLES.fullmatch(key)}
    return {**clean, "PYTHONPATH": path, **extra}


def cli_command(module: str, *overrides: str, log_dir: Path) -> list[str]:
    """``python -m <module>`` (``sensor_task.train``) with Hydra overrides, writing under ``log_dir``.
    Flags (``-m``) go first: Hydra's argument parser takes the overrides as one trailing list."""
    flags = [arg for arg in overrides if arg.startswith("-")]
    values = [arg for arg in overrides if not arg.startswith("-")]
    return [sys.executable, "-m", module, *flags, f"paths.log_dir={log_dir}", *values]


def run_cli(module: str, *overrides: str, log_dir: Path, env: dict | None = None, timeout: float = 600):
    """Run ``python -m <module>`` as a user would, from engine/tests, wait for it, and capture its
    output (a ``subprocess.CompletedProcess``)."""
    return subprocess.run(cli_command(module, *overrides, log_dir=log_dir), cwd=HERE, env=cli_env(**(env or {})),
                          capture_output=True, text=True, timeout=timeout)  # fmt: skip


def supervisor_imports(log_dir: Path) -> Path:
    """Where a run of ``import_probe`` logging to ``log_dir`` lists what its command's own process
    imported (the top-level packages, one per line): beside ``log_dir``, not in it."""
    return log_dir.parent / f"{log_dir.name}-imports.txt"


def override_keys(overrides: Sequence[str]) -> set[str]:
    """The keys and groups that ``overrides`` set (``data``, ``model.net.dropout``), flags left out."""
    return {arg.lstrip("+~").split("=", 1)[0] for arg in overrides if not arg.startswith("-")}


# torchrun shares its rendezvous TCPStore with the workers by default, and since the store keeps
# the previous attempt's keys, restarted workers meet stale peer addresses (pytorch/pytorch#135712).
# Opting out of the sharing is torch's documented workaround; the scaling-out docs say so too.
TORCHRUN_ENV = {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}


def torchrun(module: str, *torchrun_args: str, overrides: Sequence[str], log_dir: Path, env: dict | None = None,
             timeout: float = 600) -> subprocess.CompletedProcess:  # fmt: skip
    """Run ``python -m <module>`` under real torchrun (``python -m torch.distributed.run
    <torchrun_args>``), as :func:`run_cli` runs it alone; wait for it, and capture its output."""
    command = [sys.executable, "-m", "torch.distributed.run", *torchrun_args,
               *cli_command(module, *overrides, log_dir=log_dir)[1:]]  # fmt: skip
    return subprocess.run(command, cwd=HERE, env={**(env or cli_env()), **TORCHRUN_ENV}, capture_output=True,
                          text=True, timeout=timeout)  # fmt: skip


def trainjob_pods(manifest: dict, log: Path) -> list[subprocess.Popen]:
    """Start the pods of a Kubeflow TrainJob ``manifest`` (``launcher=kubeflow``) on this machine: its
    container's command and environment once per node, with the ``PET_*`` variables Kubeflow
    Trainer's torch runtime gives each pod (``PET_NODE_RANK``: the pod's index; node 0's pod the
    master, here at a free port), their output appended to ``log``."""
    trainer = manifest["spec"]["trainer"]
    container_env = {entry["name"]: entry["value"] for entry in trainer["env"]}
    # The image's PATH has torchrun: here, this environment's.
    container_env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), os.environ["PATH"]])
    port, pods = free_port(), []
    for node_rank in range(trainer["numNodes"]):
        pet = {"PET_NNODES": str(trainer["numNodes"]), "PET_NPROC_PER_NODE": str(trainer["numProcPerNode"]),
               "PET_NODE_RANK": str(node_rank), "PET_MASTER_ADDR": "127.0.0.1",
               "PET_MASTER_PORT": str(port)}  # fmt: skip
        command, env = [*trainer["command"], *trainer["args"]], cli_env(**container_env, **pet)
        with log.open("a") as output:  # the pod keeps its own copy of the file open
            pods.append(subprocess.Popen(command, cwd=HERE, env=env, stdout=output, stderr=subprocess.STDOUT))
    return pods


def simulated_slurm(bin_dir: Path, job_id: str, ntasks: int, env: dict | None = None) -> dict[str, str]:
    """The environment of a SLURM batch job on one node, for running a batch script here.

    SLURM cannot exist here, so ``bin_dir`` gets two stand-ins (put first on PATH): ``srun``, which
    starts one task per ``SLURM_NTASKS`` with the variables srun gives each task, writes their pids
    into ``bin_dir/tasks.pids`` and waits for them; and ``scontrol``, which appends its arguments
    to ``bin_dir/scontrol.log``. Everything the tasks do (Lightning's SLURMEnvironment, gloo, the
    run) is real. Returns ``env`` (default :func:`cli_env`) with the job's SLURM variables and that PATH.
    """
    bin_dir.mkdir(parents=True, exist_ok=True)
    (bin_dir / "srun").write_text(
        "#!/bin/bash\n"
        "pids=()\n"
        "for ((task = 0; task < SLURM_NTASKS; task++)); do\n"
        '  SLURM_PROCID=$task SLURM_LOCALID=$task SLURM_NODEID=0 SLURM_STEP_ID=0 "$@" & pids+=($!)\n'
        "done\n"
        f'echo "${{pids[@]}}" > {bin_dir / "tasks.pids"}\n'
        'status=0; for pid in "${pids[@]}"; do wait "$pid" || status=$?; done; exit $status\n'
    )
    (bin_dir / "scontrol").write_text(f'#!/bin/bash\necho "$@" >> {bin_dir / "scontrol.log"}\n')
    for tool in ("srun", "scontrol"):
        (bin_dir / tool).chmod(0o755)
    slurm = {"SLURM_JOB_ID": job_id, "SLURM_JOB_NAME": "ddp-job", "SLURM_JOB_NUM_NODES": "1", "SLURM_NNODES": "1",
             "SLURM_NTASKS": str(ntasks), "SLURM_NTASKS_PER_NODE": str(ntasks), "SLURM_NODELIST": "127.0.0.1",
             "SLURM_JOB_NODELIST": "127.0.0.1"}  # fmt: skip
    base = {key: value for key, value in (env or cli_env()).items() if key not in ("MASTER_ADDR", "MASTER_PORT")}
    return {**base, **slurm, "PATH": f"{bin_dir}{os.pathsep}{base['PATH']}"}


def read_scalars(event_dir: Path, steps: bool = False) -> dict[str, list]:
    """Every scalar tag in the TensorBoard event files of ``event_dir``, read with TensorBoard's own
    reader: its values, or ``(step, value)`` pairs with ``steps=True``.

    Read with ``EventAccumulator`` and checked against :func:`scalars_as_the_app_shows`: the two
    readers drop a resumed run's replaced points on different markers, and a test must see what
    the TensorBoard app shows."""
    events = EventAccumulator(str(event_dir), size_guidance={"scalars": 0})
    events.Reload()
    points = {tag: [(event.step, event.value) for event in events.Scalars(tag)] for tag in events.Tags()["scalars"]}
    assert points == scalars_as_the_app_shows(event_dir), "EventAccumulator and the TensorBoard app disagree"
    return points if steps else {tag: [value for _, value in pairs] for tag, pairs in points.items()}


def scalars_as_the_app_shows(event_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """``{tag: [(step, value), ...]}`` of every scalar tag in ``event_dir``, as the TensorBoard app's
    Python loader (``tensorboard --load_fast=false``, its fallback where the Rust data server does
    not run) shows them: it takes a run's first ``SessionLog.START`` for the run's own start and
    drops points only at a later one, where ``EventAccumulator`` drops them at every START."""
    events = plugin_event_accumulator.EventAccumulator(str(event_dir), size_guidance={"tensors": 0})
    events.Reload()
    return {
        tag: [(event.step, tensor_util.make_ndarray(event.tensor_proto).item()) for event in events.Tensors(tag)]
        for tag in events.Tags()["tensors"]
        if events.SummaryMetadata(tag).plugin_data.plugin_name == "scalars"
    }


def ranks_in_log(run_dir: Path, job: str = "train") -> set[int]:
    """The global ranks that wrote lines into a job's log file (``[rank N]`` tags)."""
    return {int(rank) for rank in re.findall(r"\[rank (\d+)\]", (run_dir / f"{job}.log").read_text())}


def params(run_dir: Path, checkpoint: str = "last.ckpt") -> dict[str, torch.Tensor]:
    """The model parameters a run's checkpoint holds (its ``state_dict``)."""
    return torch.load(run_dir / "checkpoints" / checkpoint, weights_only=True)["state_dict"]


def max_difference(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    """The largest absolute difference between two runs' parameters (:func:`params`)."""
    return max((a[key] - b[key]).abs().max().item() for key in a)


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now, for a rendezvous a test starts."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def only(path: Path) -> Path:
    """The one entry of a folder (a run's directory in ``runs/``); fails if there are others."""
    (item,) = path.iterdir()
    return item


def default_sigint() -> None:
    """A ``preexec_fn`` for a command that a test stops with Ctrl-C: SIGINT back to its default
    action, as a terminal's shell starts a command. A test run started in the background by a
    non-interactive shell (``make test &`` in a script, some CI runners) ignores SIGINT, and its
    commands would inherit that: Ctrl-C would not reach them, as POSIX wants."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def process_tree(pid: int) -> list[int]:
    """``pid`` and every live descendant of it (read from /proc), also those that started a session of
    their own (torchrun's workers do): what a container's end takes down with it."""
    parents = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            # "<pid> (<comm>) <state> <ppid> ...": the command name may hold spaces and parentheses.
            parents[int(stat.parent.name)] = int(stat.read_text().rpartition(")")[2].split()[1])
        except (OSError, ValueError, IndexError):
            continue
    tree, grown = [pid], True
    while grown:
        children = [child for child, parent in parents.items() if parent in tree and child not in tree]
        tree, grown = tree + children, bool(children)
    return tree


def processes_mentioning(text: str) -> list[str]:
    """``<pid> <command line>`` of each live process whose command line contains ``text`` (read
    from /proc; a zombie's command line is empty, so ended processes are not listed)."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            command = cmdline.read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if text in command:
            found.append(f"{cmdline.parent.name} {command}")
    return found
