"""The template's SLURM sweep launchers where Hydra can load them (``hydra/launcher=slurm`` and
``slurm_local``; see :mod:`hydra_plugins.ddp_engine_launcher` for why here):
:mod:`ddp_engine.launch.slurm_launcher`. They need the ``slurm`` extra (hydra-submitit-launcher);
without it Hydra still loads this module, and choosing either launcher says what to install."""

from hydra.plugins.launcher import Launcher

try:
    from ddp_engine.launch import slurm_launcher
except ImportError as missing:  # hydra-submitit-launcher (submitit) is an optional extra
    _MISSING = missing

    class _NotInstalled(Launcher):
        def __init__(self, **params: object) -> None:
            raise ImportError(
                f"hydra/launcher=slurm needs hydra-submitit-launcher ({_MISSING}): pip install 'ddp-engine[slurm]'."
            )

        def setup(self, **kwargs: object) -> None: ...

        def launch(self, job_overrides, initial_job_idx): ...

    class SlurmSweepLauncher(_NotInstalled):
        """``hydra/launcher=slurm`` without hydra-submitit-launcher: refused when chosen."""

    class LocalSlurmSweepLauncher(_NotInstalled):
        """``hydra/launcher=slurm_local`` without hydra-submitit-launcher: refused when chosen."""

else:

    class SlurmSweepLauncher(slurm_launcher.SlurmSweepLauncher):
        """:class:`ddp_engine.launch.slurm_launcher.SlurmSweepLauncher`, under a name Hydra loads."""

    class LocalSlurmSweepLauncher(slurm_launcher.LocalSlurmSweepLauncher):
        """:class:`ddp_engine.launch.slurm_launcher.LocalSlurmSweepLauncher`, under a name Hydra loads."""
