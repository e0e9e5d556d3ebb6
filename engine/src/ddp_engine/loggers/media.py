"""Figures, text and the run's settings, written through each logger's own API.

Lightning's loggers share one API for scalars and hyperparameters only; each tracker has its own
for images and text, and CSV has none. The callbacks (the engine's and the task's) call these on
global rank 0, and a logger without such an API is skipped (:func:`log_figure` says so once).
"""

from collections.abc import Mapping, Sequence

import lightning as L
import numpy as np
from lightning.pytorch.loggers import MLFlowLogger, TensorBoardLogger, WandbLogger
from lightning.pytorch.utilities import rank_zero_info
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from tensorboard.plugins.hparams import plugin_data_pb2
from torch.utils.tensorboard.summary import hparams

from ddp_engine.core.compat import tensorboard_file_writer

#: The loggers that take figures and text.
MEDIA_LOGGERS = (TensorBoardLogger, MLFlowLogger, WandbLogger)
_skipped_notice_given: set[int] = set()


def figure_pixels(figure: Figure) -> np.ndarray:
    """``figure`` rendered by Agg, as TensorBoard's ``add_figure`` renders it: ``(H, W, 3)`` uint8 RGB."""
    canvas = FigureCanvasAgg(figure)
    canvas.draw()
    return np.asarray(canvas.buffer_rgba())[..., :3].copy()


def media_loggers(trainer: L.Trainer) -> list:
    """The loggers of ``trainer`` that take figures and text; the first call per other logger
    logs one notice that its figures are skipped."""
    for logger in trainer.loggers:
        if not isinstance(logger, MEDIA_LOGGERS) and id(logger) not in _skipped_notice_given:
            _skipped_notice_given.add(id(logger))
            rank_zero_info(
                f"{type(logger).__name__} has no API for figures or text: the task's figures go to the other "
                "loggers only (logger=tensorboard, mlflow or wandb shows them)."
            )
    return [logger for logger in trainer.loggers if isinstance(logger, MEDIA_LOGGERS)]


def log_figure(trainer: L.Trainer, tag: str, figure: Figure, step: int) -> None:
    """Write ``figure`` as the image ``tag`` at optimizer step ``step`` to each logger that takes
    images: TensorBoard's Images tab, an MLflow artifact ``<tag>/step_<step>.png``, a W&B image."""
    loggers = media_loggers(trainer)
    if not loggers:
        return
    pixels = figure_pixels(figure)
    for logger in loggers:
        if isinstance(logger, TensorBoardLogger):
            logger.experiment.add_image(tag, pixels, global_step=step, dataformats="HWC")
        elif isinstance(logger, MLFlowLogger):
            logger.experiment.log_image(logger.run_id, pixels, artifact_file=f"{tag}/step_{step:06d}.png")
        elif isinstance(logger, WandbLogger):
            logger.log_image(key=tag, images=[pixels], step=step)


def log_settings(
    trainer: L.Trainer,
    settings: Mapping[str, int | float | str],
    metrics: Sequence[str],
    config_yaml: str,
    first: Sequence[str] = (),
) -> None:
    """Write a run's settings (flat ``{dotted key: value}``) and its composed config (YAML text)
    to every logger, each the way its tool shows them:

    - TensorBoard: the HPARAMS table, with ``metrics`` (scalar tags) as its metric columns, and
      the text ``config``. TensorBoard orders the columns by name, the hyperparameters that
      differ between the runs first; the keys in ``first`` (the job's own overrides) are marked
      so, and so come first even in a single run.
    - MLflow: run parameters, and the artifact ``config.yaml``. MLflow refuses to change a
      parameter, so a continued run (a resume) adds its new keys only and logs which changed.
    - W&B: the run's config. CSV: ``hparams.yaml``.
    """
    for logger in trainer.loggers:
        if isinstance(logger, TensorBoardLogger):
            _tensorboard_hparams(logger, settings, metrics, first)
            logger.experiment.add_text("config", f"```yaml\n{config_yaml}```", global_step=0)
        elif isinstance(logger, MLFlowLogger):
            logged = logger.experiment.get_run(logger.run_id).data.params
            if changed := [key for key, value in settings.items() if key in logged and logged[key] != str(value)]:
                rank_zero_info(f"MLflow keeps this run's first parameters; changed since: {', '.join(changed)}")
            logger.log_hyperparams({key: value for key, value in settings.items() if key not in logged})
            logger.experiment.log_text(logger.run_id, config_yaml, "config.yaml")
        else:
            logger.log_hyperparams(dict(settings))


def _tensorboard_hparams(
    logger: TensorBoardLogger, settings: Mapping[str, int | float | str], metrics: Sequence[str], first: Sequence[str]
) -> None:
    """The HPARAMS summaries of ``settings``, written into ``logger``'s event file.

    Not ``TensorBoardLogger.log_hyperparams``: given metrics, it logs them as placeholder points
    at step 0 of the real metrics' charts. These summaries name the metrics
    without a value, and TensorBoard reads the values from those charts.
    """
    experiment, session_start, _ = hparams(dict(settings), {metric: 0.0 for metric in metrics})
    # Mark the job's overrides as differing: TensorBoard sorts the columns by (not differs, name)
    # (tensorboard/plugins/hparams/backend_context.py, _sort_and_reduce_to_hparams_limit).
    content = experiment.value[0].metadata.plugin_data
    data = plugin_data_pb2.HParamsPluginData.FromString(content.content)
    for info in data.experiment.hparam_infos:
        info.differs = info.name in first
    content.content = data.SerializeToString()
    file_writer = tensorboard_file_writer(logger.experiment)
    for summary in (experiment, session_start):  # the experiment (columns) and this session's values
        if file_writer is not None:
            file_writer.add_summary(summary)
