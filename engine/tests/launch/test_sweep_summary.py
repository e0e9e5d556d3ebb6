"""The sweep's summary (``summary.csv`` and its printed table): one row per job, one column per
metric of the task (``task.metrics``) that a job has, in the task's order."""

import json

import pytest

from ddp_engine.launch.sweep_summary import columns, format_table, job_rows, mark_best


def test_the_summary_shows_the_tasks_metrics_that_the_jobs_have(tmp_path):
    records = {
        "0": {"status": "completed", "overrides": ["a=1"], "val/mse": 0.25, "test/mse": 0.5},
        "1": {"status": "failed", "overrides": ["a=2"], "rank": 1, "error": "ValueError: boom"},
        "2": {"status": "completed", "overrides": ["a=3", "ckpt_path=last"], "val/mse": 0.125, "test/mse": 1},
    }
    for job, record in records.items():
        (tmp_path / job).mkdir()
        (tmp_path / job / "metrics.json").write_text(json.dumps(record))
    names = ["val/mse", "test/mse", "val/mae"]  # val/mae: named by the task, logged by no job
    rows = job_rows(tmp_path, names)
    assert columns(rows, names) == ["job", "overrides", "status", "val/mse", "test/mse", "best", "error", "directory"]
    assert [(row["status"], row["val/mse"], row["test/mse"]) for row in rows] == [
        ("completed", "0.2500", "0.5000"), ("failed", "", ""), ("resumed", "0.1250", "1.0000"),
    ]  # fmt: skip
    assert rows[1]["error"] == "rank 1: ValueError: boom"
    header, *lines = format_table(rows, columns(rows, names)).splitlines()
    assert header.split() == ["job", "overrides", "status", "val/mse", "test/mse", "best", "error"]
    assert lines[2].split() == ["2", "a=3", "resumed", "0.1250", "1.0000"]


@pytest.mark.parametrize(("mode", "best"), [("min", "2"), ("max", "0")])
def test_the_best_completed_job_is_marked_by_the_objective_in_its_direction(tmp_path, mode, best):
    records = {
        "0": {"status": "completed", "overrides": ["a=1"], "val/mse": 0.25},
        "1": {"status": "failed", "overrides": ["a=2"], "rank": 0, "error": "ValueError: boom", "val/mse": 9.0},
        "2": {"status": "completed", "overrides": ["a=3", "ckpt_path=last"], "val/mse": 0.125},
        "3": {"status": "stopped", "overrides": ["a=4"], "val/mse": 0.0},
    }
    for job, record in records.items():
        (tmp_path / job).mkdir()
        (tmp_path / job / "metrics.json").write_text(json.dumps(record))
    rows = job_rows(tmp_path, ["val/mse"])
    marked = mark_best(rows, "val/mse", mode)
    assert (marked["job"], marked["value"]) == (best, records[best]["val/mse"])
    marks = {row["job"]: row["best"] for row in rows}
    assert marks == {job: f"{mode} val/mse" if job == best else "" for job in records}
    assert mark_best(job_rows(tmp_path, ["val/mse"]), "val/acc", "max") is None, "no job has that objective"
