"""The regression as the engine runs it (:class:`ddp_engine.api.Task`): its data and model options,
its objective (the lowest validation MSE), its metrics; no callbacks, predict or export of its own
(the commands refuse its checkpoints in one line)."""

from ddp_engine.api import Task

TASK = Task(
    package=__package__,
    data="sensors",
    model="regressor",
    objective="val/mse",
    mode="min",
    metrics=("val/mse", "test/mse", "val/mae", "test/mae"),
    trusted_modules=("probes",),  # the engine's tests' own callbacks, which their runs name
)
