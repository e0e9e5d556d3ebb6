"""The image classifier as the engine runs it (:class:`ddp_engine.api.Task`): a folder of images by
default, the highest validation accuracy as its objective, and the image machinery's figures,
predict and export."""

from ddp_engine.api import Task, TaskCommand
from ddp_engine.vision.schema import register_schemas

TASK = Task(
    package=__package__,
    data="folder",
    model="mlp",
    objective="val/acc",
    mode="max",
    metrics=("val/acc", "test/acc", "val/loss", "test/loss"),
    callbacks={
        "input_batch": {"_target_": "ddp_engine.vision.callbacks.InputBatchFigure", "max_images": 64},
        "misclassified": {"_target_": "ddp_engine.vision.callbacks.MisclassificationReport", "max_images": 64},
    },
    predict=TaskCommand(
        run="ddp_engine.vision.predict:predict",
        check_paths="ddp_engine.vision.input_path:check_predict_paths",
        check_job="ddp_engine.vision.inputs:check_predict_job",
    ),
    export=TaskCommand(
        run="ddp_engine.vision.export:export_checkpoint",
        check_paths="ddp_engine.vision.export_format:check_export_paths",
        check_job="ddp_engine.vision.export_format:check_export_job",
    ),
    schemas=register_schemas,
    trusted_modules=("probes",),  # the engine's tests' own callbacks, which their runs name
)
