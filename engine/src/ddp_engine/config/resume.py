"""Resuming a run in place: ``hydra.run.dir=<the run> ckpt_path=last`` continues it in its own
directory, with its own configuration, read from the directory.

The run's command-line overrides (``.hydra/overrides.yaml``, written by Hydra when it started) are
put in front of this command's, so the config composes as the run's did; this command's overrides
win where they set the same key. Those that would change the run's arithmetic (the global batch,
the schedule, the model, the data set and its split and order, the seed) are refused, naming the
run's value: a resume continues the same optimization, it does not start another. The rest
(``trainer.devices``, logging, callbacks, the launcher, where the data is and how it loads: the
DataModule's ``loading_keys``) apply.
"""

from collections.abc import Sequence
from pathlib import Path

from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import DictConfig, OmegaConf

from ddp_engine.config.trust import TRUST_KEY, check_saved_config, check_saved_overrides, trusted_targets
from ddp_engine.core.errors import ConfigValueError

#: Keys (and the groups under them) that a resume in place must not change; of ``data``, every key
#: but the DataModule's loading keys (:func:`ddp_engine.config.saved_run.loading_keys`).
ARITHMETIC_KEYS = (
    "model", "data", "seed", "trainer.max_epochs", "trainer.max_steps", "trainer.limit_train_batches",
    "trainer.accumulate_grad_batches", "lr_scaling",
)  # fmt: skip


def _loading_keys(saved_config: DictConfig) -> tuple[str, ...]:
    # torch only now, for a resume that changes a data key (its DataModule's class is imported).
    from ddp_engine.config.saved_run import loading_keys

    return loading_keys(saved_config.data) if "data" in saved_config else ()


def override_key(override: str) -> str:
    """``+model.optimizer.momentum=0.9`` -> ``model.optimizer.momentum`` (without ``+``, ``++`` or ``~``)."""
    (parsed,) = OverridesParser.create().parse_overrides([override])
    return parsed.key_or_group


def in_place_run_dir(args: Sequence[str]) -> Path | None:
    """The run directory this command resumes in place: ``hydra.run.dir`` when ``ckpt_path=last``
    is given too and the directory holds a run's overrides; else None."""
    values = dict(arg.split("=", 1) for arg in args if "=" in arg and not arg.startswith("-"))
    run_dir = values.get("hydra.run.dir", "").strip("'\"")
    if values.get("ckpt_path") != "last" or not run_dir:
        return None
    return Path(run_dir) if (Path(run_dir) / ".hydra" / "overrides.yaml").is_file() else None


def resume_arguments(run_dir: Path, args: Sequence[str]) -> list[str]:
    """The command line that resumes the run in ``run_dir``: its saved overrides, then ``args``
    (this command's; flags first), without the saved ones that ``args`` set again.

    The run's files are checked first (:mod:`ddp_engine.config.trust`): a saved ``trusted_targets``
    is dropped, as this command's own is the only one that counts.

    Raises:
        ConfigValueError: when ``args`` changes one of :data:`ARITHMETIC_KEYS`, naming the run's value,
            and when the run's files name a target that neither the project nor ``args`` trusts.
    """
    flags = [arg for arg in args if arg.startswith("-")]
    given = [arg for arg in args if not arg.startswith("-")]
    given_keys = {override_key(arg) for arg in given}
    trusted = trusted_targets(given)
    check_saved_overrides(run_dir / ".hydra" / "overrides.yaml", trusted, given_keys)
    check_saved_config(run_dir / ".hydra" / "config.yaml", trusted, keys=["data"])  # its class is imported
    # As written: an override may hold an interpolation (${paths.output_dir}) for the job to resolve.
    saved = OmegaConf.to_container(OmegaConf.load(run_dir / ".hydra" / "overrides.yaml"), resolve=False)
    saved_config = OmegaConf.load(run_dir / ".hydra" / "config.yaml")
    saved_by_key = {override_key(override): override for override in saved if override_key(override) != TRUST_KEY}
    for arg in given:
        key = override_key(arg)
        if not any(key == fixed or key.startswith(f"{fixed}.") for fixed in ARITHMETIC_KEYS):
            continue
        if key.startswith("data.") and key.split(".")[1] in _loading_keys(saved_config):
            continue
        was = saved_by_key.get(key)
        if was is not None and was.lstrip("+~") == arg.lstrip("+~"):
            continue
        value = was.split("=", 1)[1] if was else OmegaConf.select(saved_config, key, default=None)
        if not was and str(value) == arg.split("=", 1)[1]:
            continue
        raise ConfigValueError(
            f"{arg}: the run in {run_dir} has {key}={value}, and a resume in place continues that run. "
            f"Leave {key} out to resume it, or start a new run elsewhere (without hydra.run.dir and ckpt_path=last)."
        )
    return [*flags, *(override for key, override in saved_by_key.items() if key not in given_keys), *given]
