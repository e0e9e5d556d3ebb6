"""The MNIST classifier as the engine runs it: every fact the engine reads from this task, each
declared once (:class:`ddp_engine.api.Task`). Its entry points (:mod:`mnist_ddp.train`, ``eval``,
``predict``, ``export``) hand :data:`TASK` to the engine.
"""

from ddp_engine.api import Task, TaskCommand

from mnist_ddp.schema import register_schemas

TASK = Task(
    package=__package__,
    # conf/data/mnist.yaml and conf/model/cnn.yaml; data=<option>, model=<option> choose others.
    data="mnist",
    model="cnn",
    # The best checkpoint has the highest validation accuracy; a sweep maximizes it.
    objective="val/acc",
    mode="max",
    metrics=("val/acc", "test/acc", "val/loss", "test/loss"),
    callbacks={
        # Image train/input_batch: rank 0's first training batch as the network gets it, each titled
        # with its class name.
        "input_batch": {"_target_": "ddp_engine.vision.callbacks.InputBatchFigure", "max_images": 64},
        # Images test/confusion_matrix and test/misclassified at the end of each test.
        "misclassified": {"_target_": "ddp_engine.vision.callbacks.MisclassificationReport", "max_images": 64},
    },
    # check_paths runs before torch is imported (its module imports none); check_job once the
    # model is built, before any process starts.
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
)
