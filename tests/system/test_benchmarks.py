"""The benchmark harness (benchmarks/): its reference trains the template's model, and a short run
of the whole harness, through its command line, reports figures that agree with its runs.

The full benchmark (real MNIST, full epochs, 3 seeds) is not part of the suite: `make benchmark`.
"""

import json
import subprocess
import sys
from pathlib import Path

from conftest import REPO, cli_env, make_synthetic_mnist

from benchmarks.per_step import PER_STEP_END, PER_STEP_START

STEPS, WARMUP = 4, 2  # optimizer steps per run in the smoke test: timed, and run before them
GLOBAL_BATCH = 64  # the fast recipe's


def table_rows(markdown: str, first_cell: str) -> list[str]:
    """The cells of the table row whose first cell is ``first_cell``."""
    for line in markdown.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if cells[0] == first_cell:
            return cells[1:]
    raise AssertionError(f"no row {first_cell!r} in:\n{markdown}")


def number(cell: str) -> float:
    return float(cell.replace(",", "").rstrip("x").strip("*"))


def run_harness(tmp_path: Path, module: str, markers: tuple[str, str], *args: str) -> tuple[str, Path]:
    """Run ``python -m <module>`` on synthetic data (the 5,000 validation images the fast recipe and
    the reference hold out, plus 640 to train on) with ``args``, into a page with ``markers``.

    Returns:
        The results it wrote, checked to be printed too and to stand between the page's markers
        with the page's own text kept; and the folder of its runs.
    """
    data = make_synthetic_mnist(tmp_path / "data", n_train=5640, n_test=200)
    start, end = markers
    page = tmp_path / "performance.md"
    page.write_text(f"# Title\n\n{start}\nold results\n{end}\n\nMore text.\n")
    out, work = tmp_path / "results.md", tmp_path / "runs"
    command = [sys.executable, "-m", module, "--data-dir", str(data), *args, "--out", str(out), "--page", str(page),
               "--work-dir", str(work)]  # fmt: skip
    done = subprocess.run(command, cwd=REPO, env=cli_env(), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    results = out.read_text()
    assert results in done.stdout, "the table is printed too"
    # The page (docs/performance.md for make benchmark) keeps its text and gets the results between the markers.
    assert page.read_text() == f"# Title\n\n{start}\n{results}\n{end}\n\nMore text.\n"
    return results, work


def test_per_step_table_holds_each_programs_milliseconds_and_their_ratios(tmp_path):
    text, work = run_harness(
        tmp_path, "benchmarks.per_step", (PER_STEP_START, PER_STEP_END), "--models", "tiny", "--steps", str(STEPS),
        "--warmup", str(WARMUP), "--repeats", "1",
    )  # fmt: skip
    # Each program's timer saw exactly WARMUP + STEPS optimizer steps (the harness refuses any other
    # count), and the table holds their times over the last STEPS, with the ratios of those figures.
    timers = {
        p: json.loads((work / f"tiny-{p}-0" / "loop-timer-rank0.json").read_text())
        for p in ("raw", "lightning", "template")
    }
    for timer in timers.values():
        starts = timer["batch_starts_s"]
        assert len(starts) == WARMUP + STEPS and starts[0] == 0 and starts == sorted(starts)
        assert starts[-1] < timer["train_loop_s"]
    ms = {p: 1000 * (timer["train_loop_s"] - timer["batch_starts_s"][WARMUP]) / STEPS for p, timer in timers.items()}
    assert timers["raw"]["train_samples"] == (WARMUP + STEPS) * GLOBAL_BATCH
    assert (
        timers["lightning"]["train_samples"]
        == timers["template"]["train_samples"]
        == ((WARMUP + STEPS) * GLOBAL_BATCH // 2)
    )
    raw, lightning, vs_raw, template, _, vs_lightning = table_rows(text, "tiny")
    assert (number(raw), number(lightning), number(template)) == tuple(
        round(ms[p], 2) for p in ("raw", "lightning", "template")
    )
    assert number(vs_raw) == round(ms["lightning"] / ms["raw"], 2)
    assert number(vs_lightning.split()[0]) == round(ms["template"] / ms["lightning"], 2)
    assert vs_lightning.endswith("(met)") == (ms["template"] <= 1.05 * ms["lightning"])
