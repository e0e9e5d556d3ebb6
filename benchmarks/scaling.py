"""How DDP scales: samples/s and the exposed gradient communication per step for several world
sizes, each with the plain AllReduce and the fp16 and PowerSGD communication hooks.

    python -m benchmarks.scaling --data-dir data          # make benchmark-scaling

Weak scaling, as DDP is used: every process trains ``--per-device-batch`` samples per step (default
32), so the global batch is W times that. Each run is the template's command as a user runs it
(``python -m mnist_ddp.train`` with the CNN of :data:`CNN`; with ``--gpu`` the GPU recipe over NCCL, one process
per GPU) for ``--warmup`` + ``--steps`` optimizer steps (the step count set by
``trainer.limit_train_batches``). Its figures:

- samples/s: the global batch times ``--steps`` over rank 0's time for the steps after the warm-up
  (:class:`benchmarks.probe.LoopTimer`);
- exposed communication and step time (ms): the template's own step anatomy
  (``step/rank_<r>/exposed_comm_ms`` and ``step_ms`` in TensorBoard, ``callbacks.step_anatomy``),
  every logged window after the warm-up, the mean over ranks;
- AllReduce bytes per step: ``ddp.json``'s ``allreduce_bytes_per_step``.

Scaling efficiency: samples/s at W over W times samples/s at 1 with the plain AllReduce (at W = 1 a
hook only adds its own work: the fp16 cast, PowerSGD's factorization). Each figure is
the median of ``--repeats`` runs, the configurations interleaved. On CPU, a world size above the
cores this process may run on over-subscribes them (W processes share fewer cores); the table
says so where it does.

The table goes to ``--out`` and, with ``--page``, into a Markdown page between its scaling markers.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from datetime import date
from pathlib import Path

import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from benchmarks.per_step import TEMPLATE_GPU
from benchmarks.run import REPO, checked_data_dir, harness_env, publish, refuse_below

SCALING_START, SCALING_END = "<!-- scaling results: start -->", "<!-- scaling results: end -->"
HOOKS = ("none", "fp16", "powersgd")
#: The network every run trains: the CNN with BatchNorm (5x5 convs of 32 and 64 channels, hidden 128,
#: 739,112 gradient bytes), large enough for its AllReduce to show.
CNN = ["model.net.channels=[32,64]", "model.net.hidden=128", "model.net.batch_norm=true", "model.net.dropout=0.25"]
#: Steps between two logged windows of the step anatomy (the Trainer's ``log_every_n_steps``).
WINDOW = 10


def command(world_size: int, hook: str, run_dir: Path, data_dir: Path, options: argparse.Namespace) -> list[str]:
    """The template's command for one run: ``world_size`` processes, communication hook ``hook``."""
    recipe = [*CNN, "experiment=fast_gpu", *TEMPLATE_GPU] if options.gpu else CNN
    return [
        sys.executable, "-m", "mnist_ddp.train", *recipe, f"trainer.devices={world_size}",
        f"strategy.comm_hook={hook}", f"data.global_batch_size={world_size * options.per_device_batch}",
        "trainer.max_epochs=1", f"trainer.limit_train_batches={options.warmup + options.steps}",
        f"trainer.log_every_n_steps={WINDOW}", "data=mnist", f"data.data_dir={data_dir}", f"hydra.run.dir={run_dir}",
        "+callbacks.loop_timer._target_=benchmarks.probe.LoopTimer", f"+callbacks.loop_timer.dirpath={run_dir}",
    ]  # fmt: skip


def run_once(world_size: int, hook: str, run_dir: Path, data_dir: Path, options: argparse.Namespace) -> dict:
    """Runs one configuration to its end; returns its figures: ``samples_per_s``, ``exposed_comm_ms``,
    ``step_ms``, ``allreduce_bytes``.

    Raises:
        RuntimeError: if the run exits non-zero, or ran another number of steps than asked.
    """
    run_dir.mkdir(parents=True)
    done = subprocess.run(command(world_size, hook, run_dir, data_dir, options), cwd=REPO, env=harness_env(),
                          capture_output=True, text=True, timeout=1800)  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"W={world_size} {hook} exited {done.returncode}:\n{(done.stdout + done.stderr)[-3000:]}")
    timer = json.loads((run_dir / "loop-timer-rank0.json").read_text())
    total = options.warmup + options.steps
    if len(timer["batch_starts_s"]) != total:
        raise RuntimeError(f"W={world_size} {hook} ran {len(timer['batch_starts_s'])} steps, not {total}")
    seconds = timer["train_loop_s"] - timer["batch_starts_s"][options.warmup]
    events = EventAccumulator(str(run_dir / "tensorboard"), size_guidance={"scalars": 0})
    events.Reload()

    def after_warmup(part: str) -> float:
        """The part's mean over ranks of its median over the windows after the warm-up (ms)."""
        per_rank = []
        for rank in range(world_size):
            points = [e.value for e in events.Scalars(f"step/rank_{rank}/{part}_ms") if e.step >= options.warmup]
            per_rank.append(statistics.median(points))
        return statistics.mean(per_rank)

    return {
        "samples_per_s": world_size * options.per_device_batch * options.steps / seconds,
        "exposed_comm_ms": after_warmup("exposed_comm"),
        "step_ms": after_warmup("step"),
        "allreduce_bytes": json.loads((run_dir / "ddp.json").read_text())["allreduce_bytes_per_step"],
    }


def table(runs: dict[str, list[dict]], world_sizes: list[int], cores: int, gpu: bool) -> str:
    """Markdown: per world size and hook, the medians and the scaling efficiency."""
    lines = [
        "| world size | hook | samples/s | scaling efficiency | exposed communication (ms/step) | step (ms) "
        "| AllReduce bytes per step |",
        "|---|---|---|---|---|---|---|",
    ]

    def median(world_size: int, hook: str, key: str) -> float:
        return statistics.median(run[key] for run in runs[f"{world_size}-{hook}"])

    for world_size in world_sizes:
        crowded = "" if gpu or world_size <= cores else f" (over-subscribed: {world_size} processes on {cores} cores)"
        for hook in HOOKS:
            rate = median(world_size, hook, "samples_per_s")
            efficiency = rate / (world_size * median(1, "none", "samples_per_s")) if 1 in world_sizes else float("nan")
            sent = runs[f"{world_size}-{hook}"][0]["allreduce_bytes"]
            lines.append(
                f"| {world_size}{crowded} | {hook} | {rate:.0f} | {efficiency:.2f} "
                f"| {median(world_size, hook, 'exposed_comm_ms'):.2f} | {median(world_size, hook, 'step_ms'):.2f} "
                f"| {'n/a (PowerSGD)' if sent is None else f'{sent:,}'} |"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", type=Path, default=REPO / "data", help="folder with MNIST/raw/ (default: data)")
    parser.add_argument(
        "--world-sizes", type=int, nargs="+", default=None,
        help="processes per run (default: 1 2 4; with --gpu, 1, 2, 4, ... up to the GPUs)",
    )  # fmt: skip
    parser.add_argument("--per-device-batch", type=int, default=32, help="samples per process and step (default 32)")
    parser.add_argument("--steps", type=int, default=100, help="optimizer steps timed per run (default 100)")
    parser.add_argument("--warmup", type=int, default=20, help="optimizer steps before the timed ones (default 20)")
    parser.add_argument("--repeats", type=int, default=2, help="runs per configuration (default 2)")
    parser.add_argument("--gpu", action="store_true", help="on CUDA GPUs over NCCL, one process per GPU")
    parser.add_argument(
        "--out", type=Path, default=REPO / "benchmarks" / "scaling.md",
        help="the table (default benchmarks/scaling.md); every run's figures go beside it, as .json",
    )  # fmt: skip
    parser.add_argument("--page", type=Path, default=None, help="also put the table into this page, between markers")
    parser.add_argument("--work-dir", type=Path, default=None, help="run directories (default: a temporary one)")
    args = parser.parse_args(argv)
    gpus = torch.cuda.device_count()
    if args.world_sizes is None:
        args.world_sizes = [w for w in (1, 2, 4, 8, 16) if w <= gpus] if args.gpu else [1, 2, 4]
    refuse_below(
        parser,
        [
            ("--steps", args.steps, WINDOW),  # at least one window of the step anatomy after the warm-up
            ("--warmup", args.warmup, 0),
            ("--repeats", args.repeats, 1),
            ("--per-device-batch", args.per_device_batch, 1),
            ("--world-sizes", min(args.world_sizes, default=0), 1),
        ],
    )
    if args.gpu and max(args.world_sizes) > gpus:
        parser.error(f"--gpu --world-sizes {max(args.world_sizes)}: this machine has {gpus} CUDA GPUs")
    data_dir = checked_data_dir(parser, args.data_dir)

    configurations = [(world_size, hook) for world_size in args.world_sizes for hook in HOOKS]
    runs: dict[str, list[dict]] = {f"{w}-{h}": [] for w, h in configurations}
    with tempfile.TemporaryDirectory(prefix="mnist-ddp-scaling-") as tmp:
        work = args.work_dir or Path(tmp)
        for repeat in range(args.repeats):
            turn = repeat % len(configurations)
            for world_size, hook in configurations[turn:] + configurations[:turn]:  # interleaved, rotated
                figures = run_once(world_size, hook, work / f"{world_size}-{hook}-{repeat}", data_dir, args)
                runs[f"{world_size}-{hook}"].append(figures)
                print(f"W={world_size} {hook} run {repeat}: {json.dumps(figures)}", flush=True)

    cores = len(os.sched_getaffinity(0))
    kind = f"GPU processes ({torch.cuda.get_device_name()}, NCCL)" if args.gpu else "gloo processes"
    invocation = "python -m benchmarks.scaling " + " ".join(argv if argv is not None else sys.argv[1:])
    text = (
        f"Measured {date.today()} on {cores} CPU cores, torch {torch.__version__}, {kind}, real MNIST, the fast "
        f"recipe's CNN, {args.per_device_batch} samples per process and step, {args.steps} optimizer steps timed "
        f"per run after {args.warmup} warm-up steps, with `{invocation.strip()}`; the median of {args.repeats} "
        f"run{'s' if args.repeats > 1 else ''} per configuration (interleaved):\n\n"
        f"{table(runs, args.world_sizes, cores, args.gpu)}\n"
    )
    publish(text, runs, args.out, args.page, SCALING_START, SCALING_END)


if __name__ == "__main__":
    main()
