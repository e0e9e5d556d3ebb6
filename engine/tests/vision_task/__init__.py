"""The image machinery's test task: a small image classifier over the shared image data sets
(``data=folder``), with the shared figures, prediction and export (:mod:`ddp_engine.vision`),
written as an image task of one's own is. Its commands are ``python -m vision_task.train``
(``eval``, ``predict``, ``export``), with ``engine/tests`` on ``sys.path``; the image machinery's
tests (``engine/tests/vision/``) run on it."""
