"""The image machinery that image tasks share, beside the engine (which never imports it): image
data sets (a folder of images, MNIST's IDX files), their normalization and augmentation, the
classifier's figures, prediction over image inputs and the export of an image classifier.

Written as a task is, against the engine's public module :mod:`ddp_engine.api` alone. Its configs
(``conf/data/image.yaml``, ``folder.yaml``) are on Hydra's search path after the engine's; an image
task stores its schemas (:func:`ddp_engine.vision.schema.register_schemas`, in its ``Task.schemas``).
Needs the ``vision`` extra: ``pip install 'ddp-engine[vision]'``.
"""
