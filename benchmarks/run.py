"""The template against a hand-written DDP program, side by side on this machine.

    python -m benchmarks.run --data-dir data          # or: make benchmark

Measures, in one run, each figure the median over ``--seeds`` (one repetition per seed, the
programs interleaved so that a slow moment of the machine does not hit one program only):

1. the reference, ``benchmarks/reference_ddp.py``, a hand-written torchrun + DistributedDataParallel
   loop doing the work of the default recipe, 2 gloo processes;
2. the template's default recipe, ``python -m mnist_ddp.train``, started by
   the command itself (the README's command), under torchrun, and with 2 DataLoader workers per
   process (``data.num_workers=2``, from the command): training-loop time, training samples/s,
   test accuracy, time from the command's start to the first optimizer step, end-to-end wall
   time, peak RSS per process;
3. the input pipeline alone: the DataModule's train loader against torchvision's PIL-based MNIST
   with ``ToTensor``/``Normalize`` and a DataLoader (and the ``TensorDataset`` loader the
   reference uses), in this process; and MNIST as a folder of PNGs (``data=folder``, written once
   into ``--folder-cache``): the folder DataModule in memory and decoding per sample (in the
   process and in 2 workers) against torchvision's ``ImageFolder``, and the data wait of a training
   step with each of the DataModule's folder loaders (``benchmarks/pipeline.py``);
4. the default recipe's test accuracy per seed, and whether it reached 99.0% after its one epoch
   within 20 s of the command's start;
5. the time to refuse a bad command line: a bad value (checked with torch and Lightning), a
   missing input of eval, a typo (checked with Hydra alone).

It prints a markdown table with the ratios to the reference, writes it to ``--out`` and, with
``--page``, into a Markdown page between the ``benchmark results`` markers (``make benchmark``:
``--page docs/performance.md``).
"""

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import date
from pathlib import Path

import torch
from ddp_engine.core.errors import UsageError
from ddp_engine.vision.idx import ensure_mnist_files

REPO = Path(__file__).resolve().parents[1]
#: Test accuracy the default recipe must reach after its one epoch (median of the seeds), each seed
#: at least :data:`SEED_FLOOR_ACC`, within :data:`TARGET_S` of the command's start.
TARGET_ACC, SEED_FLOOR_ACC, TARGET_S = 0.99, 0.989, 20.0
RESULTS_START, RESULTS_END = "<!-- benchmark results: start -->", "<!-- benchmark results: end -->"


def torchrun(nproc: int) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}"]


def reference_command(run_dir: Path, data_dir: Path, seed: int, options: argparse.Namespace) -> list[str]:
    command = [*torchrun(options.nproc), str(REPO / "benchmarks" / "reference_ddp.py"), "--data-dir", str(data_dir)]
    command += ["--seed", str(seed), "--out", str(run_dir / "loop-timer-rank0.json")]
    command += ["--bf16", "--compile"] if options.gpu else []
    limit = options.limit_train_batches
    return command + (["--limit-train-batches", str(limit)] if limit else [])


def template_args(run_dir: Path, data_dir: Path, seed: int, options: argparse.Namespace) -> list[str]:
    """The default recipe's command-line overrides, plus the LoopTimer probe (benchmarks/probe.py).
    With ``options.gpu``: ``experiment=fast_gpu`` with the NCCL preset, the template's GPU recipe."""
    recipe = ["experiment=fast_gpu", "strategy=ddp_nccl"] if options.gpu else []
    args = [*recipe, f"trainer.devices={options.nproc}"]
    args += [f"seed={seed}", "data=mnist", f"data.data_dir={data_dir}", f"hydra.run.dir={run_dir}"]
    args += ["+callbacks.loop_timer._target_=benchmarks.probe.LoopTimer", f"+callbacks.loop_timer.dirpath={run_dir}"]
    limit = options.limit_train_batches
    return args + ([f"trainer.limit_train_batches={limit}"] if limit else [])


PROGRAMS = {
    "reference": reference_command,
    "template": lambda *a: [sys.executable, "-m", "mnist_ddp.train", *template_args(*a)],
    "template_torchrun": lambda *a: [*torchrun(a[-1].nproc), "-m", "mnist_ddp.train", *template_args(*a)],
    "template_workers": lambda *a: [sys.executable, "-m", "mnist_ddp.train", *template_args(*a), "data.num_workers=2"],
}
LABELS = {
    "reference": "reference: torchrun + DDP by hand",
    "template": "template: `python -m mnist_ddp.train`",  # the command starts and supervises its processes
    "template_torchrun": "template under torchrun",
    "template_workers": "template, `data.num_workers=2`",
}
#: The most the first optimizer step of a run with DataLoader workers may come after one without.
WORKERS_TARGET = 1.15


def harness_env() -> dict[str, str]:
    """This process's environment with the repository on PYTHONPATH: the programs load
    ``benchmarks`` modules (the LoopTimer probe, plain Lightning) from any working directory."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}


def run_once(program: str, run_dir: Path, data_dir: Path, seed: int, options: argparse.Namespace) -> dict:
    """Runs one program to its end and returns its figures (:func:`read_figures`).

    Raises:
        RuntimeError: if the program exits non-zero (its output's tail is in the message).
    """
    run_dir.mkdir(parents=True)
    start_unix, start = time.time(), time.perf_counter()
    done = subprocess.run(PROGRAMS[program](run_dir, data_dir, seed, options), cwd=REPO, env=harness_env(),
                          capture_output=True, text=True, timeout=1800)  # fmt: skip
    e2e = time.perf_counter() - start
    if done.returncode != 0:
        raise RuntimeError(f"{program} (seed {seed}) exited {done.returncode}:\n{(done.stdout + done.stderr)[-3000:]}")
    return read_figures(program, run_dir, start_unix, e2e)


def read_figures(program: str, run_dir: Path, start_unix: float, e2e_s: float) -> dict:
    """The figures of a finished run of ``program`` (a key of :data:`PROGRAMS`) in ``run_dir``, which
    started at Unix time ``start_unix`` and took ``e2e_s`` seconds: training-loop time (s), training
    samples/s, test accuracy, command start to first optimizer step (s), end-to-end time (s), peak
    RSS of the first and last rank (MiB).

    Raises:
        FileNotFoundError, KeyError, IndexError: when the run left no timer or metrics (it failed).
    """
    timers = [json.loads(p.read_text()) for p in sorted(run_dir.glob("loop-timer-rank*.json"))]
    rank0 = timers[0]
    if program == "reference":
        test_acc, samples, rss = rank0["test_acc"], rank0["train_samples"], rank0["peak_rss_mib"]
    else:
        test_acc = json.loads((run_dir / "metrics.json").read_text())["test/acc"]
        samples, rss = sum(t["train_samples"] for t in timers), [t["peak_rss_mib"] for t in timers]
    return {
        "train_loop_s": rank0["train_loop_s"],
        "samples_per_s": samples / rank0["train_loop_s"],
        "test_acc": test_acc,
        "first_step_s": rank0["first_step_unix"] - start_unix,
        "e2e_s": e2e_s,
        "rss_rank0_mib": rss[0],
        "rss_rank1_mib": rss[-1],
    }


#: Command lines refused before any process starts, timed from the command's start to its exit:
#: (entry point, overrides, the refusal's kind, the start of its error). ``{work}`` is the harness's
#: work folder, ``{files}`` a folder of placeholder files there: ``last.ckpt`` and ``last.onnx``
#: (refused before their contents are read, as the error's start shows).
REFUSALS = {
    "model.optimizer.lr=-1": ("mnist_ddp.train", ["model.optimizer.lr=-1"], "value", "model.optimizer: Invalid"),
    "trainer.devices=0": (
        "mnist_ddp.train",
        ["trainer.accelerator=cpu", "trainer.devices=0"],
        "value",
        "trainer.devices=0",
    ),
    "data.val_size=70000": ("mnist_ddp.train", ["data.val_size=70000"], "value", "data.val_size=70000"),
    "eval ckpt_path=<missing file>": (
        "mnist_ddp.eval",
        ["ckpt_path={work}/missing.ckpt"],
        "input",
        "ckpt_path={work}/missing.ckpt: no such file",
    ),
    "predict input=<missing folder>": (
        "mnist_ddp.predict",
        ["ckpt_path={files}/last.ckpt", "input={work}/missing"],
        "input",
        "input={work}/missing: no such file or folder",
    ),
    "export output=<existing file>": (
        "mnist_ddp.export",
        ["ckpt_path={files}/last.ckpt", "format=onnx"],
        "input",
        "output={files}/last.onnx exists",
    ),
    "model.optimizr.lr=0.1 (a typo)": (
        "mnist_ddp.train",
        ["model.optimizr.lr=0.1"],
        "key",
        "Unknown key model.optimizr",
    ),
}

#: The longest each kind of refusal may take, in seconds.
REFUSAL_TARGETS_S = {"value": 3.0, "input": 3.0, "key": 1.0}


def measure_refusals(data_dir: Path, work: Path, runs: int) -> dict[str, list[float]]:
    """Seconds from the start of each command of :data:`REFUSALS` to its exit, ``runs`` times each
    (interleaved), with its log folder in ``work``.

    Raises:
        RuntimeError: when a command is not refused as the template refuses (exit status 1, one
            ``Error:`` line on stderr that starts as :data:`REFUSALS` says, nothing written into its log folder).
    """
    seconds: dict[str, list[float]] = {name: [] for name in REFUSALS}
    files = work / "refusal-files"
    files.mkdir(parents=True, exist_ok=True)
    for name in ("last.ckpt", "last.onnx"):
        (files / name).write_bytes(b"a placeholder, never read")
    for _ in range(runs):
        for name, (module, overrides, _kind, error) in REFUSALS.items():
            log_dir = work / "refusals"
            args = [f"data.data_dir={data_dir}", f"paths.log_dir={log_dir}"]
            args += [override.format(work=work, files=files) for override in overrides]
            start = time.perf_counter()
            done = subprocess.run([sys.executable, "-m", module, *args], cwd=REPO, env=harness_env(),
                                  capture_output=True, text=True, timeout=300)  # fmt: skip
            seconds[name].append(time.perf_counter() - start)
            lines = done.stderr.strip().splitlines()
            expected = f"Error: {error.format(work=work, files=files)}"
            if done.returncode != 1 or len(lines) != 1 or not lines[0].startswith(expected) or log_dir.exists():
                output = done.stdout[-2000:] + done.stderr[-3000:]
                raise RuntimeError(f"{name} was not refused in one line starting {expected!r}:\n{output}")
    return seconds


def refusals_table(refusals: dict[str, list[float]]) -> str:
    """Markdown: each refused command's median seconds and its target."""
    lines = ["| refused command | kind | seconds (median) | target |", "|---|---|---|---|"]
    for name, seconds in refusals.items():
        kind = REFUSALS[name][2]
        lines.append(
            f"| `{name}` | {kind} | {statistics.median(seconds):.2f} | at most {REFUSAL_TARGETS_S[kind]:.0f} s |"
        )
    return "\n".join(lines)


# (key, row title, number format, True when lower is better)
ROWS = [
    ("train_loop_s", "training-loop time (s, rank 0)", "{:.1f}", True),
    ("samples_per_s", "training samples/s", "{:,.0f}", False),
    ("test_acc", "test accuracy", "{:.4f}", False),
    ("first_step_s", "command start to first optimizer step (s)", "{:.1f}", True),
    ("e2e_s", "end-to-end wall time (s)", "{:.1f}", True),
    ("rss_rank0_mib", "peak RSS, rank 0 (MiB)", "{:,.0f}", True),
    ("rss_rank1_mib", "peak RSS, rank 1 (MiB)", "{:,.0f}", True),
]


def results_table(runs: dict[str, list[dict]]) -> str:
    """Markdown: one row per figure, the median over the runs of each program, and its ratio to the
    reference's median."""
    programs = list(runs)
    header = (
        "| figure (median) | "
        + " | ".join(LABELS[p] + ("" if p == "reference" else " | ratio") for p in programs)
        + " |"
    )
    lines = [header, "|---" * (1 + 2 * len(programs) - 1) + "|"]
    for key, title, fmt, _ in ROWS:
        medians = {p: statistics.median(r[key] for r in runs[p]) for p in programs}
        cells = [fmt.format(medians["reference"])]
        for p in programs[1:]:
            cells += [fmt.format(medians[p]), f"{medians[p] / medians['reference']:.2f}x"]
        lines.append(f"| {title} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def seeds_table(runs: dict[str, list[dict]], seeds: list[int]) -> str:
    """Markdown: per seed and program, the test accuracy after the one epoch and the time to 99.0%
    test accuracy (the run's end-to-end wall time when it got there: accuracy is measured once,
    at the end)."""

    def time_to_target(run: dict) -> str:
        return f"{run['e2e_s']:.1f} s" if run["test_acc"] >= TARGET_ACC else "not reached"

    header = "| seed | " + " | ".join(f"{LABELS[p]}: test acc | time to {TARGET_ACC:.1%}" for p in runs) + " |"
    lines = [header, "|---" * (2 * len(runs) + 1) + "|"]
    for i, seed in enumerate(seeds):
        cells = [f"{runs[p][i]['test_acc']:.4f} | {time_to_target(runs[p][i])}" for p in runs]
        lines.append(f"| {seed} | " + " | ".join(cells) + " |")
    medians = [statistics.median(r["test_acc"] for r in runs[p]) for p in runs]
    lines.append("| **median** | " + " | ".join(f"**{m:.4f}** | " for m in medians) + " |")
    return "\n".join(lines)


def targets(
    runs: dict[str, list[dict]], pipeline: dict[str, float], refusals: dict[str, list[float]] | None = None
) -> str:
    """The issue's targets, each with its measured figure and whether it is met."""

    def median(program: str, key: str) -> float:
        return statistics.median(r[key] for r in runs[program])

    loop_ratio = median("template", "train_loop_s") / median("reference", "train_loop_s")
    pil_ratio = pipeline["template"] / pipeline["pil"]
    acc = median("template", "test_acc")
    checks = [(f"training-loop time {loop_ratio:.2f}x the reference's", loop_ratio <= 1.10, "at most 1.10x")]
    for program in [p for p in ("template", "template_torchrun") if p in runs]:
        name = LABELS[program].split(": ")[-1]
        for key, what in (("first_step_s", "command start to first optimizer step"), ("e2e_s", "end-to-end wall time")):
            ratio = median(program, key) / median("reference", key)
            checks.append((f"{what}, {name}: {ratio:.2f}x the reference's", ratio <= 1.10, "at most 1.10x"))
    for name, seconds in (refusals or {}).items():
        limit = REFUSAL_TARGETS_S[REFUSALS[name][2]]
        taken = statistics.median(seconds)
        checks.append((f"`{name}` refused in {taken:.2f} s", taken <= limit, f"at most {limit:.0f} s"))
    if "template_workers" in runs:
        ratio = median("template_workers", "first_step_s") / median("template", "first_step_s")
        checks.append((f"command start to first optimizer step with `data.num_workers=2`: {ratio:.2f}x without",
                       ratio <= WORKERS_TARGET, f"at most {WORKERS_TARGET:.2f}x"))  # fmt: skip
    lowest = min(r["test_acc"] for r in runs["template"])
    e2e = median("template", "e2e_s")
    checks += [
        (f"input pipeline {pil_ratio:,.0f}x the PIL path", pil_ratio >= 20, "at least 20x"),
        (f"test accuracy after one epoch {acc:.4f} (median of {len(runs['template'])} seeds)", acc >= TARGET_ACC,
         f"at least {TARGET_ACC}"),
        (f"lowest seed's test accuracy {lowest:.4f}", lowest >= SEED_FLOOR_ACC, f"at least {SEED_FLOOR_ACC}"),
        (f"`python -m mnist_ddp.train` from its start to its test accuracy and exit: {e2e:.1f} s (median)",
         e2e <= TARGET_S, f"at most {TARGET_S:.0f} s"),
    ]  # fmt: skip
    return "\n".join(f"- {'met' if ok else '**missed**'}: {text} (target: {goal})" for text, ok, goal in checks)


def report(
    runs: dict[str, list[dict]],
    pipeline: dict[str, float],
    options: argparse.Namespace,
    command: str,
    folder: dict | None = None,
    refusals: dict[str, list[float]] | None = None,
) -> str:
    """The results: the table of the programs, the input pipelines (with ``folder``, the result of
    :func:`benchmarks.pipeline.measure_folder`, the folder loaders and their data wait too), the
    accuracy per seed, the refusals' times (with ``refusals``, from :func:`measure_refusals`) and
    the targets."""
    cores, seeds = len(os.sched_getaffinity(0)), options.seeds
    kind = f"GPU processes ({torch.cuda.get_device_name()}, NCCL)" if options.gpu else "gloo processes"
    processes = f"{options.nproc} {kind}"
    pipeline_rows = "\n".join(
        f"| {name} | {rate:,.0f} | {rate / pipeline['pil']:,.1f}x |" for name, rate in pipeline.items()
    )
    if folder is not None:
        from benchmarks.pipeline import folder_tables  # imports Lightning (see main)

        folder_text = f"\n{folder_tables(folder)}"
    else:
        folder_text = ""
    refusal_text = ""
    if refusals:
        runs_each = len(next(iter(refusals.values())))
        refusal_text = f"\nRefused command lines, from the command's start to its exit (median of {runs_each}):\n\n"
        refusal_text += refusals_table(refusals) + "\n"
    return f"""Measured {date.today()} on {cores} CPU cores ({platform.processor() or platform.machine()}), torch
{torch.__version__}, {processes}, real MNIST, with `{command}`. Each figure is the median of
{len(seeds)} runs per program (seeds {", ".join(map(str, seeds))}, programs interleaved); ratios are to the reference.

{results_table(runs)}

Input pipeline, one process, per-device batch 32, samples/s (median of 5 passes; the template's batches
normalized by its DataModule's `on_after_batch_transfer`, as in training):

| loader | samples/s | vs PIL path |
|---|---|---|
{pipeline_rows}
{folder_text}
Default recipe, test accuracy after its one epoch, and time to 99.0% from the command's start, per seed:

{seeds_table(runs, seeds)}

{refusal_text}
Targets:
{targets(runs, pipeline, refusals)}
"""


def checked_data_dir(parser: argparse.ArgumentParser, data_dir: Path) -> Path:
    """``data_dir`` resolved, once it holds MNIST's IDX files (nothing is downloaded); else the
    harness exits with ``parser``'s one-line usage error (status 2)."""
    try:
        ensure_mnist_files(data_dir.resolve())
    except UsageError as error:  # no MNIST there, and no download: one line, not a traceback
        parser.error(f"--data-dir {data_dir}: {error}")
    return data_dir.resolve()


def refuse_below(parser: argparse.ArgumentParser, counts: list[tuple[str, int, int]]) -> None:
    """Exit with ``parser``'s usage error (status 2) at the first ``(flag, value, least)`` whose
    value is below its least."""
    for flag, value, least in counts:
        if value < least:
            parser.error(f"{flag} {value}: at least {least}")


def publish(text: str, runs: dict, out: Path, page: Path | None, start: str, end: str) -> None:
    """Write a harness's table ``text`` to ``out`` and its runs' figures beside it (``.json``), put
    the table into ``page`` between ``start`` and ``end`` when given (:func:`update_page`), and print it."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    out.with_suffix(".json").write_text(json.dumps(runs, indent=2) + "\n")
    if page:
        update_page(page, text, start, end)
    print(text)


def update_page(page: Path, text: str, start: str = RESULTS_START, end: str = RESULTS_END) -> None:
    """Replaces what is between the markers ``start`` and ``end`` in the Markdown file ``page`` with ``text``.

    Raises:
        ValueError: if the page lacks either marker.
    """
    content = page.read_text()
    if start not in content or end not in content:
        raise ValueError(f"{page} has no '{start}' ... '{end}' block to put the results in")
    head, rest = content.split(start, 1)
    tail = rest.split(end, 1)[1]
    page.write_text(f"{head}{start}\n{text}\n{end}{tail}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", type=Path, default=REPO / "data", help="folder with MNIST/raw/ (default: data)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3], help="one run per seed and program")
    parser.add_argument("--programs", nargs="+", choices=list(PROGRAMS), default=list(PROGRAMS))
    parser.add_argument("--limit-train-batches", type=int, default=None, help="shorter epochs (smoke test)")
    parser.add_argument("--nproc", type=int, default=2, help="DDP processes per program (default 2)")
    parser.add_argument(
        "--gpu", action="store_true",
        help="GPUs over NCCL: experiment=fast_gpu strategy=ddp_nccl, the reference in bf16, compiled",
    )  # fmt: skip
    parser.add_argument("--pipeline-samples", type=int, default=None, help="samples per input pipeline pass")
    parser.add_argument(
        "--folder-cache", type=Path, default=REPO / "logs" / ".cache" / "benchmarks",
        help="where MNIST is written once as a folder of PNGs, and reused (default: logs/.cache/benchmarks)",
    )  # fmt: skip
    parser.add_argument(
        "--folder-samples", type=int, default=5000,
        help="samples per pass of the folder loaders that decode per sample (default 5,000)",
    )  # fmt: skip
    parser.add_argument(
        "--wait-steps", type=int, default=100, help="timed training steps per pass of the data-wait loop (default 100)"
    )
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results.md")
    parser.add_argument(
        "--page", type=Path, default=None, help="also put the results into this Markdown page, between its markers"
    )
    parser.add_argument("--work-dir", type=Path, default=None, help="run directories (default: a temporary one)")
    args = parser.parse_args(argv)
    if "reference" not in args.programs:
        parser.error("--programs must include reference: every ratio is to it")
    data_dir = args.data_dir.resolve()
    ensure_mnist_files(data_dir)  # downloads MNIST on first use, as training would

    # Imported here, not at the top: it imports Lightning, which the helpers that per_step and
    # gpu_check import from this module do not need (gpu_check refuses a machine without CUDA at once).
    from benchmarks.pipeline import measure_folder, measure_input_pipelines

    print("Input pipeline ...", flush=True)
    pipeline = measure_input_pipelines(data_dir, samples=args.pipeline_samples)
    print("Input pipeline of MNIST as a folder of PNGs ...", flush=True)
    folder = measure_folder(
        data_dir, args.folder_cache, samples=args.pipeline_samples, lazy_samples=args.folder_samples,
        steps=args.wait_steps,
    )  # fmt: skip
    runs: dict[str, list[dict]] = {program: [] for program in args.programs}
    with tempfile.TemporaryDirectory(prefix="mnist-ddp-bench-") as tmp:
        work = args.work_dir or Path(tmp)
        for i, seed in enumerate(args.seeds):
            order = args.programs[i % len(args.programs) :] + args.programs[: i % len(args.programs)]
            for program in order:
                figures = run_once(program, work / f"{program}-seed{seed}", data_dir, seed, args)
                runs[program].append(figures)
                print(f"{program} seed {seed}: " + ", ".join(f"{k} {v:.4g}" for k, v in figures.items()), flush=True)

        print("Refusals ...", flush=True)
        refusals = measure_refusals(data_dir, work, len(args.seeds))

    command = "python -m benchmarks.run " + " ".join(argv if argv is not None else sys.argv[1:])
    text = report(runs, pipeline, args, command.strip(), folder, refusals)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    # Every run's figures too, for whoever wants more than the medians.
    args.out.with_suffix(".json").write_text(
        json.dumps(
            {"runs": runs, "input_pipeline": pipeline, "folder_pipeline": folder, "refusals": refusals}, indent=2
        )
        + "\n"
    )
    if args.page:
        update_page(args.page, text)
    print(text)


if __name__ == "__main__":
    main()
