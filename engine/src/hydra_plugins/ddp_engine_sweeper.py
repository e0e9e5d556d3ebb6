"""The template's Optuna sweeper where Hydra can load it (Hydra instantiates a sweeper only from its
``hydra_plugins`` namespace package): :class:`ddp_engine.launch.optuna_search.ResumableOptunaSweeper`,
whose search continues in its sweep's directory. Importing this module imports neither Optuna nor
its Hydra plugin (an optional dependency): Hydra imports it whenever it looks for plugins."""

from ddp_engine.launch import optuna_search


class ResumableOptunaSweeper(optuna_search.ResumableOptunaSweeper):
    """:class:`ddp_engine.launch.optuna_search.ResumableOptunaSweeper`, under a name Hydra loads."""
