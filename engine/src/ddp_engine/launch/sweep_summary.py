"""The end of a ``-m`` sweep: one row per job, printed and written to ``summary.csv`` in the sweep's directory."""

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from ddp_engine.core.files import write_csv
from ddp_engine.core.run_dir import METRICS_FILE, read_metrics

log = logging.getLogger(__name__)

#: The jobs of this command's sweep that failed, filled by :class:`SweepSummary` at the sweep's end.
_failed: list[str] = []

#: The columns of the table before and after the task's metrics (:func:`columns`). ``status``:
#: ``completed``; ``resumed`` (completed after it resumed from its ``last.ckpt`` when the sweep was
#: continued); ``failed``; ``stopped`` (by a signal). ``best``: on the best completed job's row, the
#: objective and its direction (``min val/mse``), empty on the others.
FIRST_COLUMNS, LAST_COLUMNS = ("job", "overrides", "status"), ("best", "error", "directory")
#: The override a continued sweep adds to a job that resumes from its ``last.ckpt``.
RESUMED = "ckpt_path=last"


def failed_jobs() -> list[str]:
    """The directories of the jobs that failed in this command's sweep (empty for a single run)."""
    return list(_failed)


def columns(rows: Sequence[dict[str, Any]], metrics: Sequence[str]) -> list[str]:
    """The table's columns: those of every job, and each of ``metrics`` (``task.metrics``) that a
    job of ``rows`` has (an evaluation has no ``val/`` metric), in that order."""
    shown = [metric for metric in metrics if any(row.get(metric, "") != "" for row in rows)]
    return [*FIRST_COLUMNS, *shown, *LAST_COLUMNS]


def job_rows(sweep_dir: Path, names: Sequence[str]) -> list[dict[str, Any]]:
    """One row per job directory of ``sweep_dir`` that holds a ``metrics.json``, in job order, with
    a value (4 decimals) or ``""`` for each metric of ``names`` (``task.metrics``)."""
    rows = []
    jobs = [path for path in sweep_dir.iterdir() if (path / METRICS_FILE).is_file()]
    for job in sorted(jobs, key=lambda path: (not path.name.isdigit(), int(path.name) if path.name.isdigit() else 0)):
        metrics = read_metrics(job)
        failed = metrics.get("status") == "failed"
        # A continued sweep resumes an interrupted job with ckpt_path=last (ddp_engine.launch.sweep_launcher).
        overrides = [override for override in metrics.get("overrides", []) if override != RESUMED]
        status = metrics.get("status", "completed")
        if status == "completed" and len(overrides) < len(metrics.get("overrides", [])):
            status = "resumed"
        rows.append(
            {
                "job": job.name,
                "overrides": " ".join(overrides),
                "status": status,
                **{
                    name: f"{metrics[name]:.4f}" if isinstance(metrics.get(name), int | float) else "" for name in names
                },
                "best": "",
                "error": (f"rank {metrics['rank']}: " if metrics.get("rank") is not None else "") + metrics["error"]
                if failed
                else "",
                "directory": str(job),
            }
        )
    return rows


def mark_best(rows: list[dict[str, Any]], objective: str, mode: str) -> dict[str, Any] | None:
    """Mark the row of the best completed job by ``objective`` (its ``metrics.json``'s value) in
    direction ``mode`` (``max`` or ``min``): its ``best`` column says ``<mode> <objective>``. Returns
    that row with the objective's value as ``value``, or None when no completed job has it."""
    scored = []
    for row in rows:
        value = read_metrics(Path(row["directory"])).get(objective)
        if row["status"] in ("completed", "resumed") and isinstance(value, int | float):
            scored.append((value, row))
    if not scored:
        return None
    value, best = (max if mode == "max" else min)(scored, key=lambda scored_row: scored_row[0])
    best["best"] = f"{mode} {objective}"
    return {**best, "value": value}


def format_table(rows: list[dict[str, Any]], columns: Sequence[str]) -> str:
    """The rows as an aligned text table of ``columns`` with a header line. Its ``overrides`` column
    shows the overrides that differ between the jobs (what the sweep varied); ``summary.csv`` has them all."""
    common = set.intersection(*(set(row["overrides"].split()) for row in rows)) if len(rows) > 1 else set()
    rows = [{**row, "overrides": " ".join(o for o in row["overrides"].split() if o not in common)} for row in rows]
    columns = [column for column in columns if column != "directory"]
    widths = {column: max(len(column), *(len(str(row[column])) for row in rows)) for column in columns}
    lines = ["  ".join(column.ljust(widths[column]) for column in columns)]
    lines += ["  ".join(str(row[column]).ljust(widths[column]) for column in columns) for row in rows]
    return "\n".join(line.rstrip() for line in lines)


class SweepSummary(Callback):
    """Hydra callback: at the end of a ``-m`` sweep (basic or Optuna sweeper), print a table of
    every job (overrides, status, the task's metrics: ``task.metrics``, the best job by
    ``task.objective``, the failed rank's error), write it to ``<sweep dir>/summary.csv``, and end
    with a line naming the best job, its objective and its directory; the command then exits with
    status 1 if a job failed."""

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        sweep_dir = Path(config.hydra.sweep.dir)
        rows = job_rows(sweep_dir, config.task.metrics) if sweep_dir.is_dir() else []
        if not rows:
            return
        objective, mode = config.task.objective, str(getattr(config.task.mode, "value", config.task.mode))  # an Enum
        best = mark_best(rows, objective, mode)
        shown = columns(rows, config.task.metrics)
        try:
            write_csv(sweep_dir / "summary.csv", shown, ([row[column] for column in shown] for row in rows))
        except OSError as error:  # a full disk: the table and the best job are still printed
            log.error(f"The sweep's summary could not be written: {error}")
        _failed[:] = [row["directory"] for row in rows if row["status"] == "failed"]
        failed = f", {len(_failed)} failed" if _failed else ""
        log.info(f"Sweep of {len(rows)} jobs{failed} ({sweep_dir / 'summary.csv'}):\n{format_table(rows, shown)}")
        if best is None:
            log.info(f"No job completed with {objective}: no best job.")
        else:
            log.info(f"Best job: #{best['job']}, {objective}={best['value']:.4f} ({mode}): {best['directory']}")
