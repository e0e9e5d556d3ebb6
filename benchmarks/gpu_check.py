"""The GPU check: what CPU machines cannot run, on one machine with NVIDIA GPUs, in under 8 minutes.

    python -m benchmarks.gpu_check --data-dir /path/to/data      # or: make gpu-check

CI and development run on CPUs, so the GPU code paths (the data set on the device, bf16-mixed,
``torch.compile``, NCCL, SyncBatchNorm) are written to torch's and Lightning's APIs but run only
where there is a GPU. This script runs them on the GPUs present (all of them, or as many as split
the fast recipe's global batch of 64 evenly), one step after another:

- ``fast_gpu`` (a): ``python -m mnist_ddp.train experiment=fast_gpu strategy=ddp_nccl``, one process
  per GPU, timed end to end; its test accuracy from the run's ``metrics.json``;
- ``reference`` (b): the hand-written loop (``benchmarks/reference_ddp.py --bf16 --compile``) under
  torchrun on the same GPUs, for the ratios of the two (both built by ``benchmarks/run.py``);
- ``sync_batchnorm`` (d): two short trainings with ``trainer.sync_batchnorm`` on and off over NCCL:
  with it every rank's BatchNorm running statistics must be identical and every BatchNorm layer
  a SyncBatchNorm, without it they must differ (or equality would prove nothing). On one GPU the
  world size is 1 (NCCL takes one process per GPU): the step is skipped and says so;
- ``cuda_tests`` (e): the tests marked ``cuda`` (skipped without a GPU): ``pytest -m cuda``;
- ``per_step`` (c): ``benchmarks/per_step.py --gpu``, the milliseconds per optimizer step of the
  hand-written loop, plain Lightning and the template, one run each. Near the end: it is the
  longest, and when its time runs out the figures of the runs it finished are kept;
- ``scaling`` (f): ``benchmarks/scaling.py --gpu`` on 1 GPU and on all of them, each with the plain
  AllReduce and the fp16 and PowerSGD hooks: samples/s, scaling efficiency, exposed communication.

Each step has its own time limit (:data:`TIMEOUT_S`) and the whole check a budget (``--budget``):
a step that runs past its limit is stopped with every process it started (SIGTERM, then SIGKILL)
and recorded as ``timeout``; a step left with too little of the budget is ``skipped``. Every
step's outcome (passed / failed / timeout / skipped, with the reason, its time, its figures and,
unless it passed, the tail of its output) goes into one results file, ``--out`` (Markdown) and the
same name with ``.json``, rewritten after every change, so a kill leaves the steps done so far;
each command's whole output is in ``<out>-logs/``.

The GPU machine may have no internet: MNIST must be in ``--data-dir`` (default ``data/``) as
``MNIST/raw/`` with the four uncompressed IDX files; nothing is downloaded. Without CUDA or without
the data the check exits at once with one line on stderr and exit status 1, and writes nothing.
Exit status 0: no step failed or timed out.
"""

import argparse
import importlib.util
import json
import os
import platform
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ElementTree
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import torch
from ddp_engine.vision.idx import MNIST_FILES

from benchmarks import run
from benchmarks.per_step import GLOBAL_BATCH

#: Each step's own limit (seconds), about twice what it should take on one H200 with 16 CPU cores
#: (estimated, not yet measured): fast_gpu 60-100 s (process start-up; compiling the training and
#: the evaluation graphs with a cold cache; 860 steps; two evaluations), reference 40-70 s,
#: sync_batchnorm two runs of 20-30 s, cuda_tests 40-70 s (collection, a training command, the
#: in-process test), per_step 6 runs of 10-20 s, scaling 6 runs of 10-20 s. Their sum is above the
#: budget on purpose: the last steps get what is left, and per_step keeps the figures of the runs it finished.
TIMEOUT_S = {"fast_gpu": 180, "reference": 120, "sync_batchnorm": 100, "cuda_tests": 120, "per_step": 150,
             "scaling": 150}  # fmt: skip
#: The whole check's default budget: 8 minutes less this script's start-up and last writes.
BUDGET_S = 465
#: After SIGTERM, before SIGKILL: the template's supervisor stops its workers, which write their stacks.
KILL_GRACE_S = 10.0
#: A step that would get less than this of the budget is skipped rather than cut short.
MIN_STEP_S = 20.0
#: Below this the GPU recipe is broken, not unlucky (the target, run.TARGET_ACC, is reported apart).
SANITY_ACC = 0.98
#: Largest difference between two ranks' BatchNorm statistics that counts as identical.
BN_TOLERANCE = 1e-6
#: Optimizer steps of each sync_batchnorm run; per_step's steps and runs per program and model.
SYNC_BN_STEPS, PER_STEP_STEPS, PER_STEP_REPEATS = 20, 300, 1
#: scaling's optimizer steps timed per run.
SCALING_STEPS = 100
#: per_step's progress lines (``tiny raw run 0: 3.10 ms/step``): the figures of a run cut short.
PER_STEP_LINE = re.compile(r"^(\w+) (\w+) run (\d+): ([\d.]+) ms/step$", re.MULTILINE)


class CheckFailed(Exception):
    """A step ran but its outcome is wrong; ``figures``: what it measured all the same."""

    def __init__(self, reason: str, figures: dict | None = None) -> None:
        super().__init__(reason)
        self.figures = figures or {}


@dataclass
class Outcome:
    """One command's end: its exit status (None if it was stopped before it ended), whether it ran
    past its limit, its wall time (s) from its start (Unix time), and the file with its output."""

    returncode: int | None
    timed_out: bool
    seconds: float
    start_unix: float
    log: Path


@dataclass
class Step:
    """One step of the check: ``commands`` run one after the other, the repository as working
    directory, under ``timeout_s`` in all; ``evaluate`` turns their outcomes into figures or raises
    :class:`CheckFailed`; ``partial`` gives the figures of a step that ran out of time. ``skip``:
    why the step does not run here. ``run_dirs`` are created first, ``env`` added to the environment."""

    name: str
    title: str
    timeout_s: float
    commands: list[list[str]] = field(default_factory=list)
    evaluate: Callable[[list[Outcome]], dict] | None = None
    partial: Callable[[list[Outcome]], dict] | None = None
    skip: str | None = None
    run_dirs: list[Path] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)


def processes_used(gpus: int) -> int:
    """The DDP processes for ``gpus`` GPUs, one per GPU: the most, up to ``gpus``, that split the global
    batch of :data:`GLOBAL_BATCH` evenly (the template refuses any other count; 6 GPUs -> 4)."""
    return max(n for n in range(1, max(gpus, 1) + 1) if GLOBAL_BATCH % n == 0)


def check_exit(outcome: Outcome, what: str) -> None:
    """Raises :class:`CheckFailed` unless ``outcome`` exited 0."""
    if outcome.returncode != 0:
        raise CheckFailed(f"{what} exited {outcome.returncode} (its output: {outcome.log.name})")


# --- running a command under a time limit --------------------------------------------------------


def descendants(pid: int) -> list[int]:
    """Every process below ``pid``, read from /proc (torch's elastic agent starts each worker
    in a session of its own, so the process group of ``pid`` does not hold them)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])  # after "pid (comm)": state, ppid
        except (OSError, IndexError, ValueError):
            continue  # ended meanwhile
        children.setdefault(ppid, []).append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, ended but not yet reaped by its parent, does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def stop_tree(process: subprocess.Popen, grace_s: float = KILL_GRACE_S) -> None:
    """Stops ``process`` and every process below it: SIGTERM to all of them (the template's supervisor
    and torchrun then stop their workers themselves), SIGKILL to those still running after
    ``grace_s`` seconds; then reaps ``process``. The tree is read before the first signal: a worker
    whose parent ends first is adopted by init and could not be found below ``process`` any more."""
    tree = [process.pid, *descendants(process.pid)]
    for signum, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
        targets = [pid for pid in tree + [p for p in descendants(process.pid) if p not in tree] if alive(pid)]
        for pid in targets:
            try:
                os.kill(pid, signum)
            except ProcessLookupError:
                pass
        end = time.monotonic() + wait_s
        while time.monotonic() < end and any(alive(pid) for pid in targets):
            process.poll()  # reaps the command itself once it ends
            time.sleep(0.1)
    process.wait()


def run_command(
    command: list[str], timeout_s: float, log: Path, env: dict[str, str] | None = None, grace_s: float = KILL_GRACE_S
) -> Outcome:
    """Runs ``command`` in the repository with its output (stdout and stderr) into the file ``log``,
    for at most ``timeout_s`` seconds; then, or when this process is interrupted meanwhile
    (SIGTERM, Ctrl-C), stops it with every process it started (:func:`stop_tree`).

    Raises:
        OSError: if the command cannot be started (a missing program) or ``log`` cannot be written.
    """
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("w") as output:
        start_unix, start = time.time(), time.monotonic()
        # A session of its own: a terminal's Ctrl-C reaches this process alone, which stops the tree.
        process = subprocess.Popen(command, cwd=run.REPO, env=env, stdout=output, stderr=subprocess.STDOUT,
                                   start_new_session=True)  # fmt: skip
        try:
            returncode, timed_out = process.wait(timeout=max(timeout_s, 0)), False
        except subprocess.TimeoutExpired:
            stop_tree(process, grace_s)
            returncode, timed_out = None, True
        finally:
            if process.poll() is None:  # this process was interrupted while waiting
                stop_tree(process, grace_s)
    return Outcome(returncode, timed_out, time.monotonic() - start, start_unix, log)


def output_tail(log: Path, chars: int = 3000) -> str:
    """The last ``chars`` characters of a command's output file ("" if there is none)."""
    try:
        return log.read_text(errors="replace")[-chars:]
    except OSError:
        return ""


# --- the steps -------------------------------------------------------------------------------------


def template_figures(run_dir: Path, outcome: Outcome) -> dict:
    """The fast GPU recipe's figures (:func:`benchmarks.run.read_figures`), with the backend and world
    size in effect from ``ddp.json``; fails on a backend other than NCCL or an accuracy below
    :data:`SANITY_ACC`."""
    check_exit(outcome, "the template")
    figures = run.read_figures("template", run_dir, outcome.start_unix, outcome.seconds)
    ddp = json.loads((run_dir / "ddp.json").read_text())
    figures |= {"backend": ddp["backend"], "world_size": ddp["world_size"], "target_acc": run.TARGET_ACC,
                "target_acc_met": figures["test_acc"] >= run.TARGET_ACC}  # fmt: skip
    if ddp["backend"] != "nccl":
        raise CheckFailed(f"the run used {ddp['backend']}, not NCCL", figures)
    if figures["test_acc"] < SANITY_ACC:
        raise CheckFailed(f"test accuracy {figures['test_acc']:.4f} is below {SANITY_ACC}: the GPU recipe is broken",
                          figures)  # fmt: skip
    return figures


def reference_figures(run_dir: Path, outcome: Outcome) -> dict:
    """The hand-written reference's figures (:func:`benchmarks.run.read_figures`)."""
    check_exit(outcome, "the reference")
    return run.read_figures("reference", run_dir, outcome.start_unix, outcome.seconds)


def compare_bn_stats(files: list[Path]) -> dict:
    """Every rank's BatchNorm statistics (``bn-stats-rank<r>.json`` of :class:`benchmarks.probe.BatchNormStats`)
    against rank 0's: ``ranks``, ``layers`` (per rank), ``classes`` (the layers' class names) and
    ``max_abs_diff``, the largest difference of a running mean or variance from rank 0's.

    Raises:
        CheckFailed: when there is no file, no BatchNorm layer, or the ranks name other layers.
    """
    if not files:
        raise CheckFailed("the run wrote no BatchNorm statistics (bn-stats-rank*.json)")
    ranks = [json.loads(path.read_text()) for path in files]
    if not ranks[0] or any(rank.keys() != ranks[0].keys() for rank in ranks):
        raise CheckFailed(f"the ranks' BatchNorm layers differ or are missing: {[sorted(rank) for rank in ranks]}")
    diff = max(
        (abs(a - b) for rank in ranks[1:] for name, layer in rank.items() for key in ("running_mean", "running_var")
         for a, b in zip(layer[key], ranks[0][name][key])),
        default=0.0,
    )  # fmt: skip
    classes = sorted({layer["class"] for rank in ranks for layer in rank.values()})
    return {"ranks": len(ranks), "layers": len(ranks[0]), "classes": classes, "max_abs_diff": diff}


def sync_batchnorm_figures(sync_dir: Path, control_dir: Path, nproc: int, outcomes: list[Outcome]) -> dict:
    """The SyncBatchNorm run's statistics must be identical on all ``nproc`` ranks (within
    :data:`BN_TOLERANCE`) and its layers SyncBatchNorm; the control run's, without it, must differ."""
    for outcome, what in zip(outcomes, ("the run with SyncBatchNorm", "the control run without it")):
        check_exit(outcome, what)
    if len(outcomes) < 2:
        raise CheckFailed("the control run without SyncBatchNorm did not run")
    figures = {"world_size": nproc, "sync": compare_bn_stats(sorted(sync_dir.glob("bn-stats-rank*.json"))),
               "control": compare_bn_stats(sorted(control_dir.glob("bn-stats-rank*.json")))}  # fmt: skip
    sync, control = figures["sync"], figures["control"]
    figures["ddp_sync_batchnorm"] = json.loads((sync_dir / "ddp.json").read_text())["sync_batchnorm"]
    if sync["ranks"] != nproc:
        raise CheckFailed(f"{sync['ranks']} ranks wrote BatchNorm statistics, not {nproc}", figures)
    if sync["classes"] != ["SyncBatchNorm"]:
        raise CheckFailed(f"with trainer.sync_batchnorm=true the layers are {', '.join(sync['classes'])}", figures)
    if sync["max_abs_diff"] > BN_TOLERANCE:
        raise CheckFailed(f"with SyncBatchNorm the ranks' statistics differ by up to {sync['max_abs_diff']:.3g}",
                          figures)  # fmt: skip
    if control["max_abs_diff"] <= BN_TOLERANCE:
        raise CheckFailed("without SyncBatchNorm the ranks' statistics are identical too, so equality proves "
                          "nothing (did each rank train on its own shard?)", figures)  # fmt: skip
    return figures


def junit_figures(xml_file: Path, outcome: Outcome) -> dict:
    """pytest's JUnit XML report as ``passed``, ``failed`` (test -> message) and ``skipped`` (test ->
    reason); fails unless pytest exited 0 and at least one test passed."""
    figures: dict = {"passed": [], "failed": {}, "skipped": {}}
    if xml_file.is_file():
        for case in ElementTree.parse(xml_file).iter("testcase"):
            test = f"{case.get('classname')}::{case.get('name')}"
            problem = case.find("failure") if case.find("failure") is not None else case.find("error")
            if problem is not None:
                figures["failed"][test] = (problem.get("message") or "")[:500]
            elif (skipped := case.find("skipped")) is not None:
                figures["skipped"][test] = skipped.get("message") or ""
            else:
                figures["passed"].append(test)
    if outcome.returncode == 5:  # pytest: no test collected
        raise CheckFailed("no test marked cuda was found", figures)
    if outcome.returncode != 0 or figures["failed"]:
        raise CheckFailed(f"pytest exited {outcome.returncode}: {len(figures['failed'])} failed", figures)
    if not figures["passed"]:
        raise CheckFailed("no CUDA test ran: all were skipped", figures)
    return figures


def per_step_partial(outcomes: list[Outcome]) -> dict:
    """The per-step figures of the runs done before the step was stopped (from its progress lines)."""
    runs: dict = {}
    for model, program, _, ms in PER_STEP_LINE.findall(output_tail(outcomes[-1].log, 10**6)):
        runs.setdefault(model, {}).setdefault(program, []).append(float(ms))
    return {"runs": runs}


def per_step_figures(out: Path, outcome: Outcome) -> dict:
    """per_step's figures (its JSON: model -> program -> milliseconds per step) and its table."""
    check_exit(outcome, "benchmarks.per_step")
    return {"runs": json.loads(out.with_suffix(".json").read_text()), "table": out.read_text()}


def scaling_figures(out: Path, outcome: Outcome) -> dict:
    """scaling's figures (its JSON: ``<world size>-<hook>`` -> each run's figures) and its table."""
    check_exit(outcome, "benchmarks.scaling")
    return {"runs": json.loads(out.with_suffix(".json").read_text()), "table": out.read_text()}


def missing_modules(*names: str) -> list[str]:
    """Those of the modules ``names`` that this Python cannot import."""
    return [name for name in names if importlib.util.find_spec(name) is None]


def plan(args: argparse.Namespace, gpus: int) -> list[Step]:
    """The check's steps for ``gpus`` GPUs, in the order they run, with their commands (nothing is
    run or created): ``args`` are :func:`parse_args`'s, with ``work_dir`` and ``logs_dir`` set."""
    nproc, data, work, seed = processes_used(gpus), args.data_dir, args.work_dir, args.seed
    where = f"{nproc} GPU{'s' if nproc > 1 else ''}" + (f" of {gpus}" if nproc < gpus else "")
    options = argparse.Namespace(nproc=nproc, gpu=True, limit_train_batches=None)
    fast_dir, reference_dir = work / "fast_gpu", work / "reference"
    steps = [
        Step("fast_gpu", f"(a) `python -m mnist_ddp.train experiment=fast_gpu strategy=ddp_nccl` on {where}: "
             "data on the GPU, bf16-mixed, torch.compile, NCCL; end to end", TIMEOUT_S["fast_gpu"],
             [run.PROGRAMS["template"](fast_dir, data, seed, options)],
             lambda outcomes: template_figures(fast_dir, outcomes[0]), run_dirs=[fast_dir]),
        Step("reference", f"(b) the hand-written loop, `benchmarks/reference_ddp.py --bf16 --compile` under "
             f"torchrun on {where}: the template's ratios to it", TIMEOUT_S["reference"],
             [run.PROGRAMS["reference"](reference_dir, data, seed, options)],
             lambda outcomes: reference_figures(reference_dir, outcomes[0]), run_dirs=[reference_dir]),
    ]  # fmt: skip

    title = f"(d) SyncBatchNorm over NCCL on {where}: identical BatchNorm statistics on every rank"
    if nproc < 2:
        steps.append(Step("sync_batchnorm", title, TIMEOUT_S["sync_batchnorm"], skip=(
            f"SyncBatchNorm could not be checked across processes: {gpus} GPU, so world size 1 (NCCL takes one "
            "process per GPU). That it composes with NCCL on one GPU is checked by the cuda_tests step "
            "(engine/tests/launch/test_ddp_failures.py::test_sync_batchnorm_and_nccl_on_a_gpu)")))  # fmt: skip
    else:
        short = argparse.Namespace(nproc=nproc, gpu=True, limit_train_batches=SYNC_BN_STEPS)
        sync_dir, control_dir = work / "sync_batchnorm-on", work / "sync_batchnorm-off"
        commands = [
            # The fast GPU recipe, not compiled: compiling is step (a)'s, and would take most of this step's time.
            [*run.PROGRAMS["template"](run_dir, data, seed, short), "model.compile=false",
             f"trainer.sync_batchnorm={'true' if sync else 'false'}",
             "+callbacks.bn_stats._target_=benchmarks.probe.BatchNormStats", f"+callbacks.bn_stats.dirpath={run_dir}"]
            for run_dir, sync in ((sync_dir, True), (control_dir, False))
        ]  # fmt: skip
        steps.append(Step("sync_batchnorm", title + " (and different without it)", TIMEOUT_S["sync_batchnorm"],
                          commands, lambda outcomes: sync_batchnorm_figures(sync_dir, control_dir, nproc, outcomes),
                          run_dirs=[sync_dir, control_dir]))  # fmt: skip

    xml_file = args.logs_dir / "cuda_tests.xml"
    missing = missing_modules("pytest", "xdist")
    steps.append(Step("cuda_tests", "(e) the tests marked `cuda`, skipped without a GPU: `pytest -m cuda`",
                      TIMEOUT_S["cuda_tests"],
                      [[sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-n", "0", "-m", "cuda", "-q",
                        f"--junitxml={xml_file}", "tests"]],
                      lambda outcomes: junit_figures(xml_file, outcomes[0]),
                      skip=f"{', '.join(missing)} not installed (the dev extras: pip install -e '.[dev]')" if missing
                      else None,
                      env={"MNIST_DATA_DIR": str(data)}))  # fmt: skip

    out = args.logs_dir / "per_step.md"
    steps.append(Step("per_step", f"(c) milliseconds per optimizer step on {where}: `benchmarks/per_step.py --gpu`, "
                      f"{PER_STEP_STEPS} steps, {PER_STEP_REPEATS} run per program and model", TIMEOUT_S["per_step"],
                      [[sys.executable, "-m", "benchmarks.per_step", "--gpu", "--nproc", str(nproc),
                        "--steps", str(PER_STEP_STEPS), "--repeats", str(PER_STEP_REPEATS), "--data-dir", str(data),
                        "--out", str(out), "--work-dir", str(work / "per_step")]],
                      lambda outcomes: per_step_figures(out, outcomes[0]), per_step_partial))  # fmt: skip
    scaling = args.logs_dir / "scaling.md"
    sizes = sorted({1, nproc})
    steps.append(Step("scaling", f"(f) DDP scaling on {' and '.join(map(str, sizes))} GPUs: `benchmarks/scaling.py "
                      "--gpu`, plain AllReduce, fp16 and PowerSGD hooks, 1 run each", TIMEOUT_S["scaling"],
                      [[sys.executable, "-m", "benchmarks.scaling", "--gpu", "--world-sizes", *map(str, sizes),
                        "--steps", str(SCALING_STEPS), "--repeats", "1", "--data-dir", str(data),
                        "--out", str(scaling), "--work-dir", str(work / "scaling")]],
                      lambda outcomes: scaling_figures(scaling, outcomes[0])))  # fmt: skip
    for step in steps:
        if args.only and step.name not in args.only and not step.skip:
            step.skip = f"not selected (--only {' '.join(args.only)})"
    return steps


# --- the results file -------------------------------------------------------------------------------


def comparison(data: dict) -> list[dict]:
    """The fast GPU recipe against the reference, when both passed: per figure of
    :data:`benchmarks.run.ROWS`, both values and the ratio template / reference."""
    steps = data["steps"]
    if any(steps.get(name, {}).get("status") != "passed" for name in ("fast_gpu", "reference")):
        return []
    template, reference = steps["fast_gpu"]["figures"], steps["reference"]["figures"]
    rows = []
    for key, title, fmt, _ in run.ROWS:
        if key == "rss_rank1_mib" and data.get("nproc") == 1:
            continue  # one process: its rank 0 row says it all
        rows.append({"figure": title, "format": fmt, "reference": reference[key], "template": template[key],
                     "ratio": template[key] / reference[key]})  # fmt: skip
    return rows


def summary(name: str, step: dict) -> str:
    """One line of a step's outcome for the Markdown table."""
    figures, status = step.get("figures") or {}, step["status"]
    if status in ("pending", "running"):
        return "not run" if status == "pending" else "running (or this check was killed)"
    if status != "passed" and not figures:
        return step.get("reason", "")
    if name in ("fast_gpu", "reference") and "test_acc" in figures:
        text = (f"test acc {figures['test_acc']:.4f}, training loop {figures['train_loop_s']:.1f} s, "
                f"end to end {figures['e2e_s']:.1f} s")  # fmt: skip
        if "target_acc_met" in figures:
            text += f"; {run.TARGET_ACC} target {'met' if figures['target_acc_met'] else '**missed**'}"
    elif name == "sync_batchnorm" and "sync" in figures:
        sync, control = figures["sync"], figures["control"]
        text = (f"{sync['layers']} {'/'.join(sync['classes'])} layers, statistics on {sync['ranks']} ranks differ by "
                f"{sync['max_abs_diff']:.2g}; without SyncBatchNorm by {control['max_abs_diff']:.2g}")  # fmt: skip
    elif name == "cuda_tests":
        text = (f"{len(figures['passed'])} passed, {len(figures['failed'])} failed, "
                f"{len(figures['skipped'])} skipped")  # fmt: skip
    elif name == "per_step":
        done = sum(len(ms) for by_program in figures.get("runs", {}).values() for ms in by_program.values())
        text = f"{done} runs, table below"
    elif name == "scaling" and figures.get("runs"):
        text = f"{sum(len(runs) for runs in figures['runs'].values())} runs, table below"
    else:
        text = ""
    if status != "passed" and step.get("reason"):
        return f"{text} ({step['reason']})" if text else step["reason"]
    return text


def render(data: dict) -> str:
    """The results as Markdown: the run, a table of the steps, then each step's detail."""
    gpu_names = ", ".join(sorted(set(data["gpus"])))
    if data["finished"]:
        state = f"finished in {data['seconds']:.0f} s"
    elif data.get("stopped"):
        state = f"**stopped** after {data['seconds']:.0f} s: the steps below are those done so far"
    else:
        state = "**not finished**: the steps below are those done so far"
    lines = [
        "# GPU check", "",
        f"Run {data['started']} on {len(data['gpus'])} x {gpu_names}, {data['nproc']} used (one process per GPU), "
        f"{data['cpu_cores']} CPU cores, torch {data['torch']} (CUDA {data['cuda']}, NCCL {data['nccl']}), "
        f"MNIST from `{data['data_dir']}`, with `{data['command']}`; budget {data['budget_s']:.0f} s, {state}.", "",
        "| step | what it checks | status | time (s) | limit (s) | result |", "|---|---|---|---|---|---|",
    ]  # fmt: skip
    for name, step in data["steps"].items():
        seconds = f"{step['seconds']:.1f}" if "seconds" in step else ""
        status = step["status"] if step["status"] in ("passed", "skipped", "pending") else f"**{step['status']}**"
        limit = step.get("limit_s", step["timeout_s"])
        lines.append(f"| {name} | {step['title']} | {status} | {seconds} | {limit:.0f} | {summary(name, step)} |")
    if data.get("comparison"):
        lines += ["", "## The fast GPU recipe against the hand-written loop", "",
                  "| figure | reference: torchrun + DDP by hand | template: `python -m mnist_ddp.train` | ratio |",
                  "|---|---|---|---|"]  # fmt: skip
        lines += [
            f"| {row['figure']} | {row['format'].format(row['reference'])} | "
            f"{row['format'].format(row['template'])} | {row['ratio']:.2f}x |"
            for row in data["comparison"]
        ]
    per_step = data["steps"].get("per_step", {}).get("figures") or {}
    if per_step.get("table"):
        lines += ["", "## Per step", "", per_step["table"].strip()]
    elif per_step.get("runs"):
        lines += ["", "## Per step (the runs done before the step stopped; ms per optimizer step)", ""]
        lines += [
            f"- {model} {program}: {', '.join(f'{ms:.2f}' for ms in values)}"
            for model, by_program in per_step["runs"].items()
            for program, values in by_program.items()
        ]
    scaling = data["steps"].get("scaling", {}).get("figures") or {}
    if scaling.get("table"):
        lines += ["", "## Scaling", "", scaling["table"].strip()]
    cuda = data["steps"].get("cuda_tests", {}).get("figures") or {}
    if cuda:
        lines += ["", "## CUDA tests", ""]
        lines += [f"- passed: `{test}`" for test in cuda["passed"]]
        lines += [f"- **failed**: `{test}`: {message}" for test, message in cuda["failed"].items()]
        lines += [f"- skipped: `{test}`: {reason}" for test, reason in cuda["skipped"].items()]
    for name, step in data["steps"].items():
        if step["status"] in ("failed", "timeout", "interrupted"):
            lines += ["", f"## {name}: {step['status']}", "", step.get("reason", ""), "",
                      f"Commands: {'; '.join(f'`{c}`' for c in step['commands'])}. Output: {', '.join(step['logs'])}.",
                      "", "```", step.get("output_tail", "").strip(), "```"]  # fmt: skip
    return "\n".join(lines) + "\n"


class Results:
    """The results file: ``out`` (Markdown, :func:`render`) and the same name with ``.json``, each
    rewritten whole (into a temporary file, then renamed) after every change, so that a kill at
    any moment leaves complete files with the steps done so far, the others ``pending``.

    Args:
        out: the Markdown file; its folder is created.
        header: the run's description (machine, versions, command), kept at the JSON's top level.
        steps: the plan; each step starts ``pending`` (or ``skipped`` is recorded by :func:`execute`).
        logs_dir: the folder of the commands' output files.
    """

    def __init__(self, out: Path, header: dict, steps: list[Step], logs_dir: Path) -> None:
        self.out, self.logs_dir = out, logs_dir
        self.data = {**header, "finished": False, "stopped": False, "seconds": None, "comparison": [], "steps": {
            step.name: {"title": step.title, "status": "pending", "timeout_s": step.timeout_s,
                        "commands": [shlex.join(command) for command in step.commands]}
            for step in steps
        }}  # fmt: skip
        out.parent.mkdir(parents=True, exist_ok=True)
        self.write()

    def record(self, name: str, **fields) -> None:
        """Updates step ``name`` with ``fields`` (status, reason, seconds, figures, ...) and rewrites the files."""
        self.data["steps"][name].update(fields)
        self.write()

    def relative(self, path: Path) -> str:
        """``path`` as seen from the results file's folder (the results name no machine's folders)."""
        return os.path.relpath(path, self.out.parent)

    def finish(self, seconds: float, stopped: bool = False) -> None:
        """Marks the check finished after ``seconds``, or ``stopped`` then (interrupted before its last
        step), and rewrites the files."""
        self.data |= {"finished": not stopped, "stopped": stopped, "seconds": round(seconds, 1)}
        self.write()

    def write(self) -> None:
        self.data["comparison"] = comparison(self.data)
        for path, text in ((self.out.with_suffix(".json"), json.dumps(self.data, indent=2) + "\n"),
                           (self.out, render(self.data))):  # fmt: skip
            partial = path.with_name(f".{path.name}.partial")
            partial.write_text(text)
            partial.replace(path)


def execute(
    step: Step, results: Results, deadline: float, grace_s: float = KILL_GRACE_S, min_step_s: float = MIN_STEP_S
) -> str:
    """Runs ``step`` within its limit and what is left until ``deadline`` (``time.monotonic()``) less
    ``grace_s`` (seconds for its processes to stop; skipped if that leaves under ``min_step_s``),
    records its outcome in ``results`` (``running`` first) and returns its status: ``passed``,
    ``failed``, ``timeout`` or ``skipped``.

    Raises:
        BaseException: what interrupted this process (SystemExit from SIGTERM, KeyboardInterrupt),
            after the step's processes were stopped and the step recorded as ``interrupted``.
    """
    if step.skip:
        results.record(step.name, status="skipped", reason=step.skip)
        return "skipped"
    limit = min(step.timeout_s, deadline - time.monotonic() - grace_s)
    if limit < min_step_s:
        reason = f"out of time: {max(limit, 0):.0f} s of the budget left, the step may take {step.timeout_s:.0f} s"
        results.record(step.name, status="skipped", reason=reason)
        return "skipped"
    for run_dir in step.run_dirs:
        run_dir.mkdir(parents=True, exist_ok=True)
    results.record(step.name, status="running", limit_s=round(limit), started=datetime.now().isoformat("T", "seconds"))
    env = {**run.harness_env(), **step.env}
    outcomes: list[Outcome] = []
    start = time.monotonic()
    logs = [results.logs_dir / f"{step.name}{f'-{i + 1}' if len(step.commands) > 1 else ''}.log"
            for i in range(len(step.commands))]  # fmt: skip
    try:
        for command, log in zip(step.commands, logs):
            outcomes.append(run_command(command, limit - (time.monotonic() - start), log, env, grace_s))
            if outcomes[-1].timed_out or outcomes[-1].returncode != 0:
                break  # what follows (a control run) means nothing without it
    except BaseException as err:
        stopped = f"this check was stopped ({type(err).__name__})"
        seconds = round(time.monotonic() - start, 1)
        results.record(step.name, status="interrupted", reason=stopped, seconds=seconds,
                       logs=[results.relative(log) for log in logs])  # fmt: skip
        raise
    if outcomes[-1].timed_out:
        fields = {
            "status": "timeout",
            "figures": step.partial(outcomes) if step.partial else {},
            "reason": f"ran past its {limit:.0f} s limit: stopped (SIGTERM, SIGKILL after {grace_s:g} s)",
        }
    else:
        try:
            fields = {"status": "passed", "figures": step.evaluate(outcomes)}
        except CheckFailed as err:
            fields = {"status": "failed", "reason": str(err), "figures": err.figures}
        except Exception as err:  # a run that ended without its outputs: what was missing is the reason
            fields = {"status": "failed", "reason": f"{type(err).__name__}: {err}", "figures": {}}
    if fields["status"] != "passed":
        fields["output_tail"] = output_tail(outcomes[-1].log)
    logs = [results.relative(outcome.log) for outcome in outcomes]
    results.record(step.name, seconds=round(time.monotonic() - start, 1), logs=logs, **fields)
    return fields["status"]


# --- the command line --------------------------------------------------------------------------------


def nccl_version() -> str:
    """The NCCL version torch was built with, or ``"none"``."""
    try:
        return ".".join(map(str, torch.cuda.nccl.version()))
    except (AttributeError, RuntimeError):
        return "none"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line (``work_dir`` and ``logs_dir`` are set by :func:`main`)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--data-dir",
        type=Path,
        default=run.REPO / "data",
        help="folder with MNIST/raw/ and its four IDX files; nothing is downloaded (default: data)",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=run.REPO / "benchmarks" / "gpu_check.md",
        help="the results, Markdown; the same name with .json beside it, the logs in <out>-logs/ "
        "(default: benchmarks/gpu_check.md)",
    )
    parser.add_argument(
        "--budget",
        type=float,
        default=BUDGET_S,
        help=f"seconds for all steps; one that would not fit is skipped (default {BUDGET_S})",
    )
    parser.add_argument("--gpus", type=int, default=None, help="use at most this many GPUs (default: all)")
    parser.add_argument("--only", nargs="+", choices=list(TIMEOUT_S), default=None, help="run these steps only")
    parser.add_argument("--seed", type=int, default=1, help="seed of the fast_gpu and reference runs (default 1)")
    parser.add_argument("--work-dir", type=Path, default=None,
                        help="run directories, kept (default: a temporary folder, removed at the end)")  # fmt: skip
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Runs the check; returns the exit status: 0 when no step failed or ran out of time, 1 otherwise
    or when the machine has no CUDA GPU or the data is missing (then nothing is written)."""
    start = time.monotonic()
    args = parse_args(argv)
    if not torch.cuda.is_available():
        print(f"no CUDA GPU: torch {torch.__version__} sees none on this machine; the GPU check needs NVIDIA GPUs "
              "(nothing was run or written)", file=sys.stderr)  # fmt: skip
        return 1
    args.data_dir = args.data_dir.resolve()
    raw = args.data_dir / "MNIST" / "raw"
    if missing := [name for name in MNIST_FILES.values() if not (raw / name).is_file()]:
        print(f"no MNIST: {', '.join(missing)} not in {raw}; the GPU check downloads nothing (its machine may have no "
              "internet): copy the four uncompressed IDX files there, or pass --data-dir", file=sys.stderr)  # fmt: skip
        return 1
    present = torch.cuda.device_count()
    gpus = min(args.gpus or present, present)
    args.out = args.out.resolve()
    args.logs_dir = args.out.parent / f"{args.out.stem}-logs"
    # An earlier check's files would pass for this one's (a pytest report left by a run that crashed).
    shutil.rmtree(args.logs_dir, ignore_errors=True)
    keep_work_dir = args.work_dir is not None
    args.work_dir = (args.work_dir or Path(tempfile.mkdtemp(prefix="mnist-ddp-gpu-check-"))).resolve()
    steps = plan(args, gpus)
    header = {
        "started": datetime.now().isoformat(" ", "seconds"),
        "command": shlex.join(["python", "-m", "benchmarks.gpu_check", *(sys.argv[1:] if argv is None else argv)]),
        "gpus": [torch.cuda.get_device_name(i) for i in range(gpus)], "nproc": processes_used(gpus),
        "cpu_cores": len(os.sched_getaffinity(0)), "machine": platform.machine(), "torch": torch.__version__,
        "cuda": torch.version.cuda, "nccl": nccl_version(),
        "data_dir": str(args.data_dir), "budget_s": args.budget,
    }  # fmt: skip
    results = Results(args.out, header, steps, args.logs_dir)
    # SIGTERM (a scheduler, a timeout) ends this process through SystemExit: the running step's
    # processes are stopped and the files say where it was.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    deadline = start + args.budget
    statuses = []
    try:
        for step in steps:
            print(f"{step.name}: {step.title} ...", flush=True)
            statuses.append(execute(step, results, deadline))
            print(f"{step.name}: {statuses[-1]}, {summary(step.name, results.data['steps'][step.name])}", flush=True)
    finally:
        results.finish(time.monotonic() - start, stopped=len(statuses) < len(steps))
        if not keep_work_dir:
            shutil.rmtree(args.work_dir, ignore_errors=True)
    print(f"Results: {args.out} and {args.out.with_suffix('.json')}; output of every command: {args.logs_dir}")
    return 0 if all(status in ("passed", "skipped") for status in statuses) else 1


if __name__ == "__main__":
    sys.exit(main())
