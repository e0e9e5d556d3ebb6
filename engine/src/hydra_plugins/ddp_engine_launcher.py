"""The template's sweep launcher where Hydra can load it: Hydra instantiates a launcher only from its
``hydra_plugins`` namespace package (``Plugins._instantiate`` refuses any other module), so this
module names :class:`ddp_engine.launch.sweep_launcher.ResumableLauncher` there. The launcher's code
stays in its layer; Hydra imports this module (and so that one: Hydra and OmegaConf only) whenever
it looks for plugins."""

from ddp_engine.launch import sweep_launcher


class ResumableLauncher(sweep_launcher.ResumableLauncher):
    """:class:`ddp_engine.launch.sweep_launcher.ResumableLauncher`, under a name Hydra loads."""
