"""The engine's Hydra config groups: the trainer, the DDP strategy, the launcher, the loggers, the
callbacks, the run's paths, Hydra's own settings, the debug presets, the seed and the keys every
DataModule takes (``data/sharded.yaml``).

Hydra finds them after the project's own ``conf/`` (the search path that
:mod:`hydra_plugins.ddp_engine_searchpath` extends), so a project composes them by name
(``trainer: default`` in its ``config.yaml``) and overrides them on the command line or in its own
YAMLs, and a YAML of the same group and name in the project's ``conf/`` replaces the engine's.
Not Python: a package only so that ``pkg://ddp_engine.conf`` finds it, installed or editable."""
