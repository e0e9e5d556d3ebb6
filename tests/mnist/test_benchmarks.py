"""The benchmark harness (benchmarks/): its reference trains the template's model, and a short run
of the whole harness, through its command line, reports figures that agree with its runs; the
input pipeline of a folder of images (benchmarks/pipeline.py) measures every loader on a small
folder, and writes MNIST as PNGs once.

The full benchmark (real MNIST, full epochs, 3 seeds) is not part of the suite: `make benchmark`.
"""

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest
from ddp_engine.vision.idx import read_idx_file
from helpers import REPO, cli_env, make_image_folder, make_synthetic_mnist

from benchmarks.per_step import PER_STEP_END, PER_STEP_START
from benchmarks.pipeline import (
    TREE_MARKER,
    TREE_NAME,
    folder_datamodules,
    folder_tables,
    measure_data_wait,
    measure_folder,
    measure_folder_pipelines,
    write_png_tree,
)
from benchmarks.run import ROWS, report

pytestmark = pytest.mark.processes

STEPS, WARMUP = 4, 2  # optimizer steps per run in the smoke test: timed, and run before them
GLOBAL_BATCH = 64  # per_step.GLOBAL_BATCH


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
    """Run ``python -m <module>`` on synthetic data (the 5,000 validation images the default recipe and
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


FOLDER_LOADERS = ("folder_in_memory", "folder_lazy_0", "folder_lazy_2", "imagefolder")
WAIT_LOADERS = FOLDER_LOADERS[:3]


def test_folder_pipeline_tables_hold_each_loaders_positive_figures(synthetic_data_dir, tmp_path):
    # The harness's folder measurement on the synthetic IDX files written as PNGs, with tiny counts.
    cache = tmp_path / "cache"
    folder = measure_folder(
        synthetic_data_dir, cache, samples=96, lazy_samples=64, steps=3, warmup=1, passes=2, val_size=200
    )  # fmt: skip
    # The tree holds every image once, in its label's folder (1,200 training, 300 test images).
    tree, raw = cache / TREE_NAME, synthetic_data_dir / "MNIST" / "raw"
    for split, prefix in (("train", "train"), ("test", "t10k")):
        labels = read_idx_file(raw / f"{prefix}-labels-idx1-ubyte", 1, "labels").tolist()
        assert {digit: len(list((tree / split / str(digit)).glob("*.png"))) for digit in range(10)} == {
            digit: labels.count(digit) for digit in range(10)
        }
    assert (folder["images"], folder["train_images"]) == (1500, 1000)
    assert folder["samples"] == dict(zip(FOLDER_LOADERS, (96, 64, 64, 64)))

    text = folder_tables(folder)
    rates, waits = text.split("Training step's data wait")
    for name in FOLDER_LOADERS:
        rate, ratio, samples = table_rows(rates, name)
        assert number(rate) > 0 and number(ratio) > 0 and number(samples) == folder["samples"][name]
    assert number(table_rows(rates, "folder_in_memory")[1]) == 1
    for name in WAIT_LOADERS:
        wait, ratio, step, share = table_rows(waits, name)
        assert number(wait) > 0 and number(ratio) > 0 and number(step) > 0
        assert 0 <= float(share.rstrip("%")) <= 100

    # benchmarks.run's report holds them after the MNIST input pipeline's table.
    runs = {program: [dict.fromkeys((row[0] for row in ROWS), 1.0)] for program in ("reference", "template")}
    options = argparse.Namespace(seeds=[1], gpu=False, nproc=2)
    page = report(runs, {"template": 3.0, "tensor_dataset": 2.0, "pil": 1.0}, options, "command", folder)
    assert text in page and page.index("| pil |") < page.index(text) < page.index("Default recipe")

    # Written once: a complete tree is reused; one without its marker (an interrupted write) is redone.
    marker = tree / TREE_MARKER
    written = marker.stat().st_mtime_ns
    assert write_png_tree(raw, tree) == tree and marker.stat().st_mtime_ns == written
    marker.unlink()
    next((tree / "train" / "3").glob("*.png")).unlink()
    write_png_tree(raw, tree)
    assert marker.is_file() and len(list((tree / "train").rglob("*.png"))) == 1200


def test_folder_measurements_take_any_image_folder(tmp_path):
    # An RGB folder of another size and classes (5 colours, 32x32): the same loaders, and the CNN built for it.
    root = make_image_folder(tmp_path / "colours", counts={"train": 20, "test": 4})
    modules = folder_datamodules(root, tmp_path / "survey", val_size=0.2)
    assert modules["folder_in_memory"].spec.input_shape == (3, 32, 32)
    rates = measure_folder_pipelines(modules, samples=32, passes=1)
    waits = measure_data_wait(modules, steps=2, warmup=1, passes=1)
    assert list(rates) == list(FOLDER_LOADERS) and all(rate > 0 for rate in rates.values())
    assert list(waits) == list(WAIT_LOADERS) and all(w["wait_ms"] > 0 and w["step_ms"] > 0 for w in waits.values())
