"""The GPU check (benchmarks/gpu_check.py, `make gpu-check`), its CPU side: the plan of steps and
their commands for a given number of GPUs, the results file (written after every step, failures and
timeouts recorded), the stop of a command's whole process tree, the SyncBatchNorm comparison, the
refusal of a machine without CUDA, and benchmarks/per_step.py's GPU options.

What needs a GPU is not mocked but left out: the plan takes the GPU count as an argument, and the
executor runs stand-in commands (small Python programs that pass, fail or hang) instead of the GPU
runs; the refusal is real (this machine has no CUDA). The GPU runs themselves are `make gpu-check`'s.
"""

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from ddp_engine.config.schema import register_configs
from helpers import CONFIG_DIR, REPO
from hydra import compose, initialize_config_dir
from torch import nn

from benchmarks import gpu_check, per_step
from benchmarks.gpu_check import CheckFailed, Results, Step
from benchmarks.probe import BatchNormStats


def make_plan(tmp_path: Path, gpus: int, *argv: str) -> dict[str, Step]:
    args = gpu_check.parse_args(["--data-dir", str(tmp_path / "data"), *argv])
    args.work_dir, args.logs_dir = tmp_path / "work", tmp_path / "logs"
    return {step.name: step for step in gpu_check.plan(args, gpus)}


def overrides(command: list[str]) -> list[str]:
    """The Hydra overrides of a ``python -m mnist_ddp.train`` command, without ``hydra.*`` (compose takes none)."""
    return [arg for arg in command[command.index("mnist_ddp.train") + 1 :] if not arg.startswith("hydra.")]


def test_plan_on_one_gpu_runs_each_step_on_it_and_skips_syncbatchnorm_saying_why(tmp_path):
    steps = make_plan(tmp_path, 1)
    assert list(steps) == ["fast_gpu", "reference", "sync_batchnorm", "cuda_tests", "per_step", "scaling"]
    (fast,) = steps["fast_gpu"].commands
    assert fast[:3] == [sys.executable, "-m", "mnist_ddp.train"]
    assert {"experiment=fast_gpu", "strategy=ddp_nccl", "trainer.devices=1", "seed=1"} <= set(fast)
    (reference,) = steps["reference"].commands
    assert "--nproc-per-node=1" in reference and str(REPO / "benchmarks" / "reference_ddp.py") in reference
    assert {"--bf16", "--compile"} <= set(reference)
    sync = steps["sync_batchnorm"]
    assert not sync.commands and "could not be checked across processes" in sync.skip and "world size 1" in sync.skip
    (tests,) = steps["cuda_tests"].commands
    assert tests[1:3] == ["-m", "pytest"] and tests[tests.index("-m", 3) + 1] == "cuda"
    assert steps["cuda_tests"].env == {"MNIST_DATA_DIR": str(tmp_path / "data")}
    (timing,) = steps["per_step"].commands
    assert timing[1:3] == ["-m", "benchmarks.per_step"] and "--gpu" in timing
    assert timing[timing.index("--nproc") + 1] == "1" and timing[timing.index("--repeats") + 1] == "1"
    (scaling,) = steps["scaling"].commands
    assert scaling[1:3] == ["-m", "benchmarks.scaling"] and "--gpu" in scaling
    assert scaling[scaling.index("--world-sizes") + 1 : scaling.index("--steps")] == ["1"], "one GPU: world size 1"
    assert all(step.timeout_s <= 180 for step in steps.values()), "one hang cannot take the budget"
    assert gpu_check.BUDGET_S + 15 <= 8 * 60, "the steps and the script's own start-up fit in 8 minutes"


@pytest.mark.parametrize(("gpus", "nproc"), [(2, 2), (3, 2), (6, 4), (8, 8), (12, 8)])
def test_plan_uses_as_many_gpus_as_split_the_global_batch_and_checks_syncbatchnorm_on_two_or_more(
    tmp_path, gpus, nproc
):
    assert gpu_check.processes_used(gpus) == nproc
    steps = make_plan(tmp_path, gpus)
    assert f"trainer.devices={nproc}" in steps["fast_gpu"].commands[0]
    assert f"--nproc-per-node={nproc}" in steps["reference"].commands[0]
    assert (f" of {gpus}" in steps["fast_gpu"].title) == (nproc < gpus)
    sync = steps["sync_batchnorm"]
    assert sync.skip is None and len(sync.commands) == 2
    for command, value in zip(sync.commands, ("true", "false")):
        assert f"trainer.sync_batchnorm={value}" in command and f"trainer.devices={nproc}" in command
        assert "+callbacks.bn_stats._target_=benchmarks.probe.BatchNormStats" in command
        assert "model.compile=false" in command and "trainer.limit_train_batches=20" in command


def test_only_runs_the_named_steps(tmp_path):
    steps = make_plan(tmp_path, 2, "--only", "fast_gpu", "per_step")
    assert [name for name, step in steps.items() if not step.skip] == ["fast_gpu", "per_step"]
    assert steps["reference"].skip == "not selected (--only fast_gpu per_step)"


def test_the_gpu_commands_compose_to_the_fast_gpu_recipe_over_nccl(tmp_path):
    steps = make_plan(tmp_path, 2)
    register_configs()
    timing = per_step.command(
        "template", "tiny", Path("run"), Path("data"), argparse.Namespace(steps=3, warmup=2, nproc=2, gpu=True)
    )
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        fast = compose(config_name="config", overrides=overrides(steps["fast_gpu"].commands[0]))
        sync = compose(config_name="config", overrides=overrides(steps["sync_batchnorm"].commands[0]))
        tiny = compose(config_name="config", overrides=overrides(timing))
    assert tiny.trainer.accelerator == "gpu" and tiny.strategy.process_group_backend == "nccl"
    assert tiny.model.net._target_.endswith("MLP") and not tiny.data.on_device, "per_step's tiny model, as on CPU"
    for cfg in (fast, sync):
        assert cfg.trainer.accelerator == "gpu" and cfg.trainer.devices == 2 and cfg.data.on_device
        assert cfg.trainer.precision == "bf16-mixed" and cfg.strategy.process_group_backend == "nccl"
        assert cfg.model.net.channels == [24, 32] and cfg.model.label_smoothing == 0.1, "the default recipe's"
    assert fast.model.compile and not sync.model.compile
    assert sync.trainer.sync_batchnorm and not fast.trainer.sync_batchnorm


def test_per_step_gpu_option_names_the_templates_device_and_backend():
    options = argparse.Namespace(steps=300, warmup=20, nproc=2, gpu=True)
    args = dict(run_dir=Path("run"), data_dir=Path("data"), options=options)
    gpu = per_step.command("template", "cnn", **args)
    assert {"trainer.accelerator=gpu", "strategy.process_group_backend=nccl", "trainer.devices=2"} <= set(gpu)
    options.gpu = False
    assert not {"trainer.accelerator=gpu", "strategy.process_group_backend=nccl"} & set(
        per_step.command("template", "cnn", **args)
    )
    # The hand-written loop and plain Lightning take the GPUs by themselves whenever CUDA is there.
    for program in ("raw", "lightning"):
        options.gpu = True
        on_gpu = per_step.command(program, "tiny", **args)
        options.gpu = False
        assert on_gpu == per_step.command(program, "tiny", **args)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusals without CUDA; this machine has CUDA")
def test_without_cuda_both_scripts_refuse_at_once_in_one_line_and_write_nothing(tmp_path, capsys):
    out = tmp_path / "results" / "gpu_check.md"
    assert gpu_check.main(["--out", str(out), "--data-dir", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("no CUDA GPU: ") and err.count("\n") == 1
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(SystemExit) as exit_status:
        per_step.main(["--gpu", "--nproc", "1", "--data-dir", str(tmp_path)])
    assert exit_status.value.code == 2 and "--gpu --nproc 1: this machine has 0 CUDA GPUs" in capsys.readouterr().err


def python(code: str) -> list[str]:
    return [sys.executable, "-c", code]


#: The run's description, as main() writes it at the top of the results.
HEADER = {"started": "2026-12-01 12:00:00", "command": "python -m benchmarks.gpu_check", "gpus": ["NVIDIA H200"],
          "nproc": 1, "cpu_cores": 16, "torch": "2.x", "cuda": "13.0", "nccl": "2.27.5", "data_dir": "data",
          "budget_s": 465}  # fmt: skip


def test_steps_are_recorded_one_by_one_with_failures_timeouts_and_skips(tmp_path):
    out = tmp_path / "gpu_check.md"
    seen_on_disk = {}

    def check_the_file_while_running(outcomes):
        # The file as a kill at this moment would leave it: the first step done, this one running.
        seen_on_disk.update(json.loads(out.with_suffix(".json").read_text())["steps"])
        gpu_check.check_exit(outcomes[0], "the command")
        return {"figure": 1.5}

    steps = [
        Step("first", "passes", 30, [python("print('hello')")], lambda outcomes: {"seconds": outcomes[0].seconds}),
        Step("second", "passes, seen from disk", 30, [python("pass")], check_the_file_while_running),
        Step("fails", "exits 3", 30, [python("print('boom'); raise SystemExit(3)")],
             lambda outcomes: gpu_check.check_exit(outcomes[0], "the command")),
        Step("hangs", "sleeps past its limit", 1, [python("print('2.5 ms/step', flush=True); import time; "
             "time.sleep(60)")], partial=lambda outcomes: {"tail": gpu_check.output_tail(outcomes[0].log)}),
        Step("skipped", "does not run here", 30, skip="needs two GPUs"),
        Step("late", "does not fit the budget", 30, [python("pass")]),
    ]  # fmt: skip
    results = Results(out, HEADER, steps, tmp_path / "logs")
    assert {step["status"] for step in json.loads(out.with_suffix(".json").read_text())["steps"].values()} == {
        "pending"
    }
    deadline = time.monotonic() + 600
    statuses = [gpu_check.execute(step, results, deadline, grace_s=0.5, min_step_s=0.5) for step in steps[:-1]]
    statuses.append(gpu_check.execute(steps[-1], results, time.monotonic() + 5, grace_s=0.5, min_step_s=10))
    assert statuses == ["passed", "passed", "failed", "timeout", "skipped", "skipped"]
    assert seen_on_disk["first"]["status"] == "passed" and seen_on_disk["second"]["status"] == "running"
    assert seen_on_disk["fails"]["status"] == "pending"

    recorded = json.loads(out.with_suffix(".json").read_text())["steps"]
    assert recorded["second"]["figures"] == {"figure": 1.5}
    assert recorded["fails"]["reason"] == "the command exited 3 (its output: fails.log)"
    assert "boom" in recorded["fails"]["output_tail"] and recorded["fails"]["logs"] == ["logs/fails.log"]
    hang = recorded["hangs"]
    assert hang["reason"].startswith("ran past its 1 s limit") and hang["seconds"] < 5
    assert "2.5 ms/step" in hang["figures"]["tail"], "what it measured before the stop is kept"
    assert recorded["skipped"]["reason"] == "needs two GPUs" and recorded["late"]["reason"].startswith("out of time")

    results.finish(12.0)
    markdown = out.read_text()
    assert "finished in 12 s" in markdown
    assert re.search(r"^\| fails \| exits 3 \| \*\*failed\*\* \| [\d.]+ \| 30 \| the command exited 3", markdown, re.M)
    assert re.search(r"^\| hangs \| .* \| \*\*timeout\*\* \| [\d.]+ \| 1 \|", markdown, re.M)
    assert "## fails: failed" in markdown and "boom" in markdown.split("## fails: failed")[1]
    assert not list(tmp_path.glob(".*.partial")), "each file is written whole, then renamed into place"


def test_a_timeout_stops_every_process_the_command_started(tmp_path):
    # A worker in a session of its own, as torch's elastic agent starts them: not in the command's group.
    code = ("import subprocess, sys, time; child = subprocess.Popen([sys.executable, '-c', 'import time; "
            "time.sleep(60)'], start_new_session=True); print(child.pid, flush=True); time.sleep(60)")  # fmt: skip
    outcome = gpu_check.run_command(python(code), 1.0, tmp_path / "out.log", grace_s=0.5)
    assert outcome.timed_out and outcome.returncode is None and outcome.seconds < 5
    worker = int(outcome.log.read_text().split()[0])
    assert not gpu_check.alive(worker)


def test_an_interrupted_check_stops_the_running_step_and_says_where_it_was(tmp_path):
    # A real Ctrl-C (SIGINT) to a process running a step, whose main thread gets it as a user's
    # would (a pytest-xdist worker runs its tests outside the main thread); SIGTERM takes the same
    # path (main() turns it into SystemExit).
    grandchild = "import subprocess, sys, time; print(subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'], start_new_session=True).pid, flush=True); time.sleep(60)"  # noqa: E501
    # The check as a user starts it from a shell: SIGINT raises KeyboardInterrupt (a pytest-xdist
    # worker's children inherit SIGINT ignored, and Python then installs no handler of its own).
    script = f"""
import signal, sys, time
signal.signal(signal.SIGINT, signal.default_int_handler)
sys.path.insert(0, {str(REPO)!r})
from benchmarks import gpu_check
from benchmarks.gpu_check import Results, Step
steps = [Step("long", "runs until interrupted", 60, [[sys.executable, "-c", {grandchild!r}]]),
         Step("next", "never starts", 60, [])]
results = Results(gpu_check.Path({str(tmp_path / "gpu_check.md")!r}), {HEADER!r}, steps,
                  gpu_check.Path({str(tmp_path / "logs")!r}))
try:
    gpu_check.execute(steps[0], results, time.monotonic() + 600, grace_s=0.5)
except KeyboardInterrupt:
    results.finish(1.5, stopped=True)
    sys.exit(130)
"""
    check = subprocess.Popen([sys.executable, "-c", script], cwd=REPO)
    log = tmp_path / "logs" / "long.log"
    deadline = time.monotonic() + 120
    while not (log.is_file() and log.read_text().strip()) and time.monotonic() < deadline:
        time.sleep(0.1)
    os.kill(check.pid, signal.SIGINT)
    assert check.wait(timeout=60) == 130
    recorded = json.loads((tmp_path / "gpu_check.json").read_text())
    assert recorded["steps"]["long"]["status"] == "interrupted" and recorded["steps"]["next"]["status"] == "pending"
    assert recorded["stopped"] and not recorded["finished"]
    assert "**stopped** after 2 s" in (tmp_path / "gpu_check.md").read_text()
    assert not gpu_check.alive(int(log.read_text().split()[0])), "the step's own child is stopped too"


def write_bn_stats(run_dir: Path, per_rank_shift: float, layer: type[nn.Module]) -> None:
    """What BatchNormStats writes on two ranks whose running statistics differ by ``per_rank_shift``."""
    for rank in (0, 1):
        net = nn.Sequential(nn.Conv2d(1, 2, 3), layer(2), nn.ReLU(), layer(2))
        for module in net.modules():
            if isinstance(module, layer):
                module.running_mean += rank * per_rank_shift
        callback = BatchNormStats(str(run_dir))
        callback.on_train_batch_end(None, net, None, None, 0)
        callback.on_fit_end(SimpleNamespace(global_rank=rank), net)


def test_syncbatchnorm_check_needs_identical_statistics_with_it_and_different_ones_without(tmp_path):
    done = [gpu_check.Outcome(0, False, 1.0, 0.0, tmp_path / "run.log")] * 2
    on, off = tmp_path / "on", tmp_path / "off"
    write_bn_stats(on, 0.0, nn.SyncBatchNorm)
    write_bn_stats(off, 0.01, nn.BatchNorm2d)
    for run_dir in (on, off):
        (run_dir / "ddp.json").write_text(json.dumps({"sync_batchnorm": run_dir == on}))
    control = gpu_check.compare_bn_stats(sorted(off.glob("bn-stats-rank*.json")))
    assert control["max_abs_diff"] == pytest.approx(0.01)
    assert control | {"max_abs_diff": 0} == {"ranks": 2, "layers": 2, "classes": ["BatchNorm2d"], "max_abs_diff": 0}
    figures = gpu_check.sync_batchnorm_figures(on, off, 2, done)
    assert figures["sync"]["max_abs_diff"] == 0 and figures["sync"]["classes"] == ["SyncBatchNorm"]

    # Equal statistics without SyncBatchNorm too: equality would prove nothing, and the check says so.
    with pytest.raises(CheckFailed, match="proves nothing"):
        gpu_check.sync_batchnorm_figures(on, on, 2, done)
    # Plain BatchNorm layers, or statistics that differ, are failures with the figures kept.
    with pytest.raises(CheckFailed, match="the layers are BatchNorm2d") as failure:
        gpu_check.sync_batchnorm_figures(off, off, 2, done)
    assert failure.value.figures["control"]["max_abs_diff"] == pytest.approx(0.01)
    failed = gpu_check.Outcome(1, False, 1.0, 0.0, tmp_path / "run.log")
    with pytest.raises(CheckFailed, match="the run with SyncBatchNorm exited 1"):
        gpu_check.sync_batchnorm_figures(on, off, 2, [failed])


def test_fast_gpu_and_reference_figures_give_the_ratios_and_a_broken_recipe_fails(tmp_path):
    template, reference = tmp_path / "fast_gpu", tmp_path / "reference"
    timer = {"first_step_unix": 105.0, "train_loop_s": 10.0, "train_samples": 27_500, "peak_rss_mib": 3000.0}
    for run_dir in (template, reference):
        run_dir.mkdir()
    (template / "loop-timer-rank0.json").write_text(json.dumps(timer))
    (template / "metrics.json").write_text(json.dumps({"test/acc": 0.9925}))
    (template / "ddp.json").write_text(json.dumps({"backend": "nccl", "world_size": 1}))
    reference_timer = {"train_loop_s": 8.0, "train_samples": 55_000, "test_acc": 0.991, "peak_rss_mib": [2000.0]}
    (reference / "loop-timer-rank0.json").write_text(json.dumps(timer | reference_timer))
    outcome = gpu_check.Outcome(0, False, 40.0, 100.0, tmp_path / "x.log")

    results = Results(tmp_path / "gpu_check.md", HEADER, [Step("fast_gpu", "a", 150), Step("reference", "b", 100)],
                      tmp_path)  # fmt: skip
    results.record("fast_gpu", status="passed", figures=gpu_check.template_figures(template, outcome))
    assert results.data["comparison"] == [], "no ratio before the reference ran"
    results.record("reference", status="passed", figures=gpu_check.reference_figures(reference, outcome))
    rows = {row["figure"]: row for row in results.data["comparison"]}
    assert rows["training-loop time (s, rank 0)"]["ratio"] == 10.0 / 8.0
    assert rows["test accuracy"]["template"] == 0.9925 and rows["command start to first optimizer step (s)"][
        "template"] == 5.0  # fmt: skip
    assert "peak RSS, rank 1 (MiB)" not in rows, "one process: no second rank"
    assert "| training-loop time (s, rank 0) | 8.0 | 10.0 | 1.25x |" in (tmp_path / "gpu_check.md").read_text()

    (template / "metrics.json").write_text(json.dumps({"test/acc": 0.5}))
    with pytest.raises(CheckFailed, match="0.5000 is below 0.98") as failure:
        gpu_check.template_figures(template, outcome)
    assert failure.value.figures["test_acc"] == 0.5 and failure.value.figures["target_acc_met"] is False


def test_cuda_test_report_lists_each_test_and_fails_on_failures_or_when_none_ran(tmp_path):
    xml = tmp_path / "cuda.xml"
    xml.write_text(
        '<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest">'
        '<testcase classname="tests.unit.test_cuda" name="test_a" time="1.0"/>'
        '<testcase classname="tests.unit.test_cuda" name="test_b" time="1.0">'
        '<failure message="AssertionError: bf16">trace</failure></testcase>'
        '<testcase classname="tests.system.test_x" name="test_c" time="0">'
        '<skipped type="pytest.skip" message="needs two GPUs">skip</skipped></testcase>'
        "</testsuite></testsuites>"
    )
    with pytest.raises(CheckFailed, match="pytest exited 1: 1 failed") as failure:
        gpu_check.junit_figures(xml, gpu_check.Outcome(1, False, 1.0, 0.0, xml))
    assert failure.value.figures == {
        "passed": ["tests.unit.test_cuda::test_a"],
        "failed": {"tests.unit.test_cuda::test_b": "AssertionError: bf16"},
        "skipped": {"tests.system.test_x::test_c": "needs two GPUs"},
    }
    with pytest.raises(CheckFailed, match="no test marked cuda"):
        gpu_check.junit_figures(tmp_path / "none.xml", gpu_check.Outcome(5, False, 1.0, 0.0, xml))


def test_every_test_skipped_without_cuda_is_marked_cuda_so_that_the_gpu_check_runs_it():
    # gpu_check selects the CUDA tests with `pytest -m cuda`; a test skipped without CUDA but not
    # marked would run nowhere.
    unmarked = []
    for path in sorted((REPO / "tests").rglob("test_*.py")):
        lines = path.read_text().splitlines()
        for i, line in enumerate(lines):
            if re.search(r"skipif\(\s*not torch\.cuda\.is_available\(\)", line):
                window = lines[max(i - 3, 0) : i + 4]
                if not any("pytest.mark.cuda" in nearby for nearby in window):
                    unmarked.append(f"{path.relative_to(REPO)}:{i + 1}")
    assert not unmarked, f"mark these tests @pytest.mark.cuda: {unmarked}"


def test_the_cuda_marker_is_registered(pytestconfig):
    assert any(marker.startswith("cuda:") for marker in pytestconfig.getini("markers"))
