"""The engine's test project: a regression on float sensor windows, not a classifier and not
images, written as a cloner writes a task of their own, against the engine's public seams only
(:mod:`sensor_task.regression`: a ``ShardedDataModule``, a LightningModule; ``conf/``: its YAMLs). Its
commands are ``python -m sensor_task.train`` (``eval``, ``predict``, ``export``), with
``engine/tests`` on ``sys.path``. The engine's own tests run on it, so that they need no project's
task and no data files."""
