"""The command line of ``python -m mnist_ddp.<train|eval|predict|export>``: checked, then run.

The check comes in two steps, both before Hydra creates a run directory and before any process
starts. First the keys and types (:mod:`mnist_ddp.cli.compose`), with Hydra and OmegaConf alone:
torch and Lightning take seconds to import, and a typo is refused in about a second. Then the
values that need objects built (:mod:`mnist_ddp.cli.preflight`), once those imports are done.
"""

import logging
import signal
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from omegaconf import OmegaConf

from mnist_ddp.cli.compose import composed_jobs, with_trainer_arguments
from mnist_ddp.cli.resume import in_place_run_dir, override_key, resume_arguments
from mnist_ddp.cli.sweep_summary import failed_jobs
from mnist_ddp.errors import UsageError


def run_entry_point(main: Callable[[], object], config_name: str) -> None:
    """What ``python -m mnist_ddp.<train|eval|predict|export>`` does.

    The command line is checked first (:func:`check_command_line`): a bad one exits with status 1
    and one line on stderr. ``hydra.run.dir=<a run> ckpt_path=last`` is completed with that run's
    overrides (:mod:`mnist_ddp.cli.resume`). Then ``main`` (Hydra's entry point) runs the job(s);
    a job whose process failed exits with status 1 and its error, a sweep with a failed job with
    status 1 after its summary.
    """
    # Warnings go through logging: tagged with the rank, kept in the job's log file.
    logging.captureWarnings(True)
    try:
        if (run_dir := in_place_run_dir(sys.argv[1:])) is not None:
            # The run's .hydra/ (its config and overrides) stays as the run wrote it.
            sys.argv = [sys.argv[0], *resume_arguments(run_dir, sys.argv[1:]), "hydra.output_subdir=null"]
        sys.argv = [sys.argv[0], *with_trainer_arguments(sys.argv[1:])]
        if config_name in CHECKPOINT_COMMANDS:
            sys.argv = [sys.argv[0], *with_data_set_of_run(sys.argv[1:])]
        check_command_line(config_name, sys.argv[1:])
    except UsageError as error:
        print(f"Error: {error}", file=sys.stderr)
        sys.exit(1)
    except KeyboardInterrupt:  # Ctrl-C while the command is being checked: nothing has started
        sys.exit(128 + signal.SIGINT)
    from mnist_ddp.cli.job import launcher_rank  # imported by the check already

    if launcher_rank() > 0:
        # torchrun / srun start every process with the same command: global rank 0 writes the
        # job's .hydra/ config, the others must not write it again at the same time.
        sys.argv.append("hydra.output_subdir=null")
    main()
    if failed_jobs():
        sys.exit(1)


#: The entry points that apply a training run's checkpoint (its model, its data set) instead of training.
CHECKPOINT_COMMANDS = ("eval", "predict", "export")


def run_data_option(checkpoint: Path) -> str | None:
    """The ``data`` option (``mnist``, ``folder``, ...) of the run that wrote ``checkpoint``
    (``<run>/checkpoints/<file>.ckpt``), from the Hydra record in its ``.hydra/hydra.yaml``; None
    without one."""
    record = Path(checkpoint).parent.parent / ".hydra" / "hydra.yaml"
    if not record.is_file():
        return None
    choice = OmegaConf.select(OmegaConf.load(record), "hydra.runtime.choices.data", default=None)
    return str(choice) if choice else None


def with_data_set_of_run(args: Sequence[str]) -> list[str]:
    """``args`` of eval / predict / export, with the data set of the checkpoint's run in front when
    they choose no ``data`` option: its option and its ``data.*`` overrides (``.hydra/``), those that
    ``args`` set again left out. The command's ``data`` node then composes as the run's did (its
    required keys set; ``data.root=`` of a folder data set that moved is a known key, and wins).
    The values of the data set are the run's in any case (:func:`mnist_ddp.cli.saved_run.data_set_of_run`)."""
    values = dict(arg.split("=", 1) for arg in args if "=" in arg and not arg.startswith("-"))
    if "data" in values or not values.get("ckpt_path"):
        return list(args)
    checkpoint = Path(values["ckpt_path"].strip("'\""))
    option = run_data_option(checkpoint)
    saved = checkpoint.parent.parent / ".hydra" / "overrides.yaml"
    if option is None or not saved.is_file():
        return list(args)
    given = {override_key(arg) for arg in args if not arg.startswith("-")}
    # As written: an override may hold an interpolation for the job to resolve.
    run_overrides = OmegaConf.to_container(OmegaConf.load(saved), resolve=False)
    data = [
        override for override in run_overrides
        if override_key(override).startswith("data.") and override_key(override) not in given
    ]  # fmt: skip
    return [f"data={option}", *data, *args]


def check_command_line(config_name: str, args: Sequence[str]) -> None:
    """Check every job that ``args`` (Hydra's command-line arguments) would run: its keys and
    types here (:func:`composed_jobs`), then its values
    (:func:`mnist_ddp.cli.preflight.check_jobs`).

    Raises:
        UsageError: the first problem found, as one line.
    """
    jobs = composed_jobs(config_name, args)
    # torch and Lightning, which take seconds to import, only now: the keys are known to be right.
    from mnist_ddp.cli.preflight import check_jobs

    check_jobs(config_name, jobs)
