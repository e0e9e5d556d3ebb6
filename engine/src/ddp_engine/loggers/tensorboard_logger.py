"""Lightning's TensorBoard logger, whose resume in place hides the replaced points from every
TensorBoard reader."""

from lightning.fabric.loggers.logger import rank_zero_experiment
from lightning.pytorch import loggers
from tensorboard.compat.proto.event_pb2 import Event, SessionLog
from typing_extensions import override

from ddp_engine.core.compat import tensorboard_file_writer


class TensorBoardLogger(loggers.TensorBoardLogger):
    """Lightning's :class:`~lightning.pytorch.loggers.TensorBoardLogger`, except that with
    ``purge_step`` (a resume in place: the run's ``last.ckpt`` step) every TensorBoard reader drops
    the points the earlier start logged from that step on, which the resumed run logs again.

    torch's ``SummaryWriter(purge_step=N)`` marks the restart with one ``SessionLog.START`` event at
    step N in the resume's event file, and writes none without ``purge_step``, so a run's first
    start has none. TensorBoard's readers disagree on that one marker: its Rust data server
    (``--load_fast=true``, the default where it runs) and ``EventAccumulator`` drop the run's
    points from step N at every START, but the Python loader of the TensorBoard app
    (``--load_fast=false``, the fallback wherever the data server does not run) takes the first
    START of a run for the run's own start, not a restart, and drops nothing: it showed the steps
    between the checkpoint and the stop twice, once from each start. Here the resume writes a
    second START at step N right after torch's, so that this loader too finds a restart, and the
    others drop nothing more (everything from step N was dropped at the first).

    Args:
        purge_step: the optimizer step the run resumes from (default None: a new run, or a restart
            whose checkpoint step is not known; every point is kept); the other arguments are
            Lightning's.
    """

    def __init__(self, *args, purge_step: int | None = None, **kwargs) -> None:
        if purge_step is not None:
            kwargs["purge_step"] = purge_step  # torch's SummaryWriter writes its START marker
        super().__init__(*args, **kwargs)
        self.purge_step = purge_step
        self._restart_marked = purge_step is None

    @property
    @override
    @rank_zero_experiment
    def experiment(self):
        experiment = super().experiment
        if not self._restart_marked:
            # The writer's event file, opened with torch's START at purge_step: the second follows it.
            start = SessionLog(status=SessionLog.START)
            file_writer = tensorboard_file_writer(experiment)
            if file_writer is not None:
                file_writer.add_event(Event(step=self.purge_step, session_log=start))
            self._restart_marked = True
        return experiment
