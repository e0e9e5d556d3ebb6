"""Milliseconds per optimizer step: the template against plain Lightning and a hand-written loop.

    python -m benchmarks.per_step --data-dir data      # make benchmark runs it after benchmarks.run

Three programs train the same model on real MNIST with the same gather loader (a batch is one
index gather from tensors in memory), global batch 64, AdamW under a one-cycle schedule,
``--nproc`` processes (gloo on CPU, NCCL on GPUs: each program takes the GPUs when CUDA is
there; ``--gpu`` insists on them, one process per GPU), for ``--steps`` optimizer steps:

1. ``raw``: ``benchmarks/reference_ddp.py --gather``, torchrun + DistributedDataParallel by hand:
   the floor;
2. ``lightning``: ``benchmarks/plain_lightning.py``, ``Trainer(strategy="ddp")`` under torchrun with
   no logger and no callback but the timer: what Lightning itself costs;
3. ``template``: ``python -m mnist_ddp.train`` as a user runs it, the step count set by
   ``trainer.limit_train_batches``.

Each for two models: ``tiny`` (Flatten + Linear 784 -> 10, ``model=mlp model.net.hidden=[]
model.net.dropout=0``), too small to hide anything, and ``cnn`` (the default recipe's,
``conf/model/cnn.yaml``). Each run takes ``--warmup`` steps more, left out of its figure: rank 0 times
its training loop from the start of the first step after the warm-up to the end of the last
optimizer step (:class:`benchmarks.probe.LoopTimer`, and the reference's own timer), so what runs
once (the first step's allocations, the template's input-batch figure, a GPU's compilation) stays
out of the cost per step; the end-to-end table of ``benchmarks.run`` counts it. A figure is that
time over ``--steps``, the median over ``--repeats`` runs, the programs interleaved.

``--without <callback>`` also runs the template without ``callbacks.<callback>`` (a fourth program,
``template-without``, interleaved with the others), and the table gives what that callback costs per
step: the template's time over the one without it.

The table goes to ``--out`` and, with ``--page``, into a Markdown page between its per-step markers.
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

from benchmarks.run import REPO, checked_data_dir, harness_env, publish, refuse_below, torchrun

PER_STEP_START, PER_STEP_END = "<!-- per-step results: start -->", "<!-- per-step results: end -->"
GLOBAL_BATCH = 64
#: The template's per-step target: at most this times plain Lightning's.
TARGET_VS_LIGHTNING = 1.05
#: The template's overrides for each model, as a user would give them.
TEMPLATE_MODEL = {"tiny": ["model=mlp", "model.net.hidden=[]", "model.net.dropout=0"], "cnn": []}
#: ``--gpu``: the template's device and backend named, not left to ``auto``, so that a run that does
#: not get the GPUs fails instead of timing CPUs. The reference and plain Lightning take the GPUs
#: whenever CUDA is there, over NCCL (their own choice, as a hand-written program's).
TEMPLATE_GPU = ["trainer.accelerator=gpu", "strategy.process_group_backend=nccl"]
LABELS = {
    "raw": "raw floor: torchrun + DDP by hand",
    "lightning": 'plain Lightning: `Trainer(strategy="ddp")`',
    "template": "template: `python -m mnist_ddp.train`",
}


def command(program: str, model: str, run_dir: Path, data_dir: Path, options: argparse.Namespace) -> list[str]:
    """The command line of one run of ``program`` with ``model`` (``--warmup`` + ``--steps`` optimizer
    steps), writing its timer into ``run_dir``."""
    steps, nproc = str(options.warmup + options.steps), options.nproc
    if program == "raw":
        reference = str(REPO / "benchmarks" / "reference_ddp.py")
        return [*torchrun(nproc), reference, "--data-dir", str(data_dir), "--model", model, "--gather",
                "--global-batch-size", str(GLOBAL_BATCH), "--limit-train-batches", steps,
                "--out", str(run_dir / "loop-timer-rank0.json")]  # fmt: skip
    if program == "lightning":
        return [*torchrun(nproc), "-m", "benchmarks.plain_lightning", "--data-dir", str(data_dir), "--model", model,
                "--global-batch-size", str(GLOBAL_BATCH), "--steps", steps, "--out-dir", str(run_dir)]  # fmt: skip
    without = [f"~callbacks.{options.without}"] if program == "template-without" else []
    return [sys.executable, "-m", "mnist_ddp.train", *TEMPLATE_MODEL[model], *(TEMPLATE_GPU if options.gpu else []),
            *without,
            f"trainer.devices={nproc}",
            f"data.global_batch_size={GLOBAL_BATCH}", "trainer.max_epochs=1", f"trainer.limit_train_batches={steps}",
            "data=mnist", f"data.data_dir={data_dir}", f"hydra.run.dir={run_dir}",
            "+callbacks.loop_timer._target_=benchmarks.probe.LoopTimer",
            f"+callbacks.loop_timer.dirpath={run_dir}"]  # fmt: skip


def ms_per_step(program: str, model: str, run_dir: Path, data_dir: Path, options: argparse.Namespace) -> float:
    """Runs one program to its end; returns rank 0's time per optimizer step after the warm-up (ms):
    from the start of step ``--warmup`` (0-based) to the end of the last, over ``--steps``.

    Raises:
        RuntimeError: if the program exits non-zero, or ran another number of steps than
            ``--warmup`` + ``--steps``.
    """
    run_dir.mkdir(parents=True)
    done = subprocess.run(command(program, model, run_dir, data_dir, options), cwd=REPO, env=harness_env(),
                          capture_output=True, text=True, timeout=1800)  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"{program} ({model}) exited {done.returncode}:\n{(done.stdout + done.stderr)[-3000:]}")
    timer = json.loads((run_dir / "loop-timer-rank0.json").read_text())
    # The reference counts the samples of every process, LoopTimer those of its own rank.
    per_step = GLOBAL_BATCH if program == "raw" else GLOBAL_BATCH // options.nproc
    total = options.warmup + options.steps
    if timer["train_samples"] != total * per_step or len(timer["batch_starts_s"]) != total:
        raise RuntimeError(f"{program} ({model}) ran {timer['train_samples'] / per_step:g} steps, not {total}")
    return 1000 * (timer["train_loop_s"] - timer["batch_starts_s"][options.warmup]) / options.steps


def table(runs: dict[str, dict[str, list[float]]]) -> str:
    """Markdown: per model, each program's median ms per step and the ratios to the floor and to
    plain Lightning, and whether the template meets its target."""
    lines = [
        f"| model | {LABELS['raw']} (ms) | {LABELS['lightning']} (ms) | vs raw | {LABELS['template']} (ms) | vs raw "
        f"| vs plain Lightning (target <= {TARGET_VS_LIGHTNING:.2f}x) |",
        "|---|---|---|---|---|---|---|",
    ]
    for model, by_program in runs.items():
        raw, lightning, template = (statistics.median(by_program[p]) for p in ("raw", "lightning", "template"))
        verdict = "met" if template <= TARGET_VS_LIGHTNING * lightning else "**missed**"
        lines.append(
            f"| {model} | {raw:.2f} | {lightning:.2f} | {lightning / raw:.2f}x | {template:.2f} "
            f"| {template / raw:.2f}x | {template / lightning:.2f}x ({verdict}) |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", type=Path, default=REPO / "data", help="folder with MNIST/raw/ (default: data)")
    parser.add_argument("--models", nargs="+", choices=list(TEMPLATE_MODEL), default=list(TEMPLATE_MODEL))
    parser.add_argument("--steps", type=int, default=300, help="optimizer steps timed per run (default 300)")
    parser.add_argument("--warmup", type=int, default=20, help="optimizer steps run before the timed ones (default 20)")
    parser.add_argument("--repeats", type=int, default=5, help="runs per program and model (default 5)")
    parser.add_argument("--nproc", type=int, default=2, help="DDP processes per program (default 2)")
    parser.add_argument("--gpu", action="store_true", help="on CUDA GPUs over NCCL, one process per GPU")
    parser.add_argument(
        "--out", type=Path, default=REPO / "benchmarks" / "per_step.md",
        help="the table (default benchmarks/per_step.md); every run's figure goes beside it, as .json",
    )  # fmt: skip
    parser.add_argument(
        "--page", type=Path, default=None, help="also put the table into this page, between its markers"
    )
    parser.add_argument("--work-dir", type=Path, default=None, help="run directories (default: a temporary one)")
    parser.add_argument(
        "--without", metavar="CALLBACK", default=None,
        help="also time the template without callbacks.CALLBACK, and give that callback's cost per step",
    )  # fmt: skip
    args = parser.parse_args(argv)
    refuse_below(
        parser,
        [
            ("--steps", args.steps, 1),
            ("--warmup", args.warmup, 0),
            ("--repeats", args.repeats, 1),
            ("--nproc", args.nproc, 1),
        ],
    )
    if args.gpu and args.nproc > torch.cuda.device_count():
        parser.error(f"--gpu --nproc {args.nproc}: this machine has {torch.cuda.device_count()} CUDA GPUs")
    data_dir = checked_data_dir(parser, args.data_dir)

    programs = [*LABELS, *(["template-without"] if args.without else [])]
    runs = {model: {program: [] for program in programs} for model in args.models}
    with tempfile.TemporaryDirectory(prefix="mnist-ddp-per-step-") as tmp:
        work = args.work_dir or Path(tmp)
        for repeat in range(args.repeats):
            for model in args.models:
                turn = repeat % len(programs)
                for program in programs[turn:] + programs[:turn]:  # interleaved, rotated
                    ms = ms_per_step(program, model, work / f"{model}-{program}-{repeat}", data_dir, args)
                    runs[model][program].append(ms)
                    print(f"{model} {program} run {repeat}: {ms:.2f} ms/step", flush=True)

    kind = f"GPU processes ({torch.cuda.get_device_name()}, NCCL)" if torch.cuda.is_available() else "gloo processes"
    invocation = "python -m benchmarks.per_step " + " ".join(argv if argv is not None else sys.argv[1:])
    text = (
        f"Measured {date.today()} on {len(os.sched_getaffinity(0))} CPU cores, torch {torch.__version__}, "
        f"{args.nproc} {kind}, real MNIST, global batch {GLOBAL_BATCH}, {args.steps} optimizer steps timed per run "
        f"after {args.warmup} warm-up steps, with `{invocation.strip()}`. Milliseconds per optimizer step on rank 0, "
        f"the median of {args.repeats} run{'s' if args.repeats > 1 else ''} per program (interleaved):\n\n"
        f"{table(runs)}\n"
    )
    if args.without:
        for model, by_program in runs.items():
            template, without = (statistics.median(by_program[p]) for p in ("template", "template-without"))
            text += (
                f"\n{model}: the template without `callbacks.{args.without}` {without:.2f} ms per step; with it "
                f"{template:.2f} ms, {template / without:.3f}x ({100 * (template / without - 1):+.1f}% per step).\n"
            )
    publish(text, runs, args.out, args.page, PER_STEP_START, PER_STEP_END)


if __name__ == "__main__":
    main()
