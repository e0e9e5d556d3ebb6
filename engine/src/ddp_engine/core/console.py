"""The console of a command's processes: once its reader is gone, output is dropped and the run goes on.

A run's console is often a pipe: ``| head``, ``| tee run.txt``, ``| less``, an ``ssh`` session's. When
the program at the other end exits, every later write fails (``BrokenPipeError``; Python ignores
SIGPIPE), and each library reacts in its own way: Rich's console ends the process (its
``on_broken_pipe`` raises ``SystemExit(1)`` in rank 0, which fails the whole job), logging prints a
traceback for every record. A training run is worth more than its console: here the first failed
write points the stream's file descriptor at ``/dev/null`` (so that every later write, Python's or
C++'s, succeeds), says so once in the job's log file, and the run goes on. The job's log file
(``train.log``) has every line, before and after.
"""

import contextlib
import logging
import os
import sys
from typing import Any, TextIO

log = logging.getLogger(__name__)


class DropsWhenClosed:
    """A text stream (``sys.stdout``, ``sys.stderr``) whose writes and flushes never fail for a
    closed reader: on the first ``BrokenPipeError`` its file descriptor is pointed at ``/dev/null``
    (``dup2``) and what could not be written is dropped. Every other attribute is the stream's own
    (``fileno``, ``isatty``, ``encoding``: what Rich, logging and faulthandler read).

    Args:
        stream: the stream to guard; it must have a file descriptor (``fileno()``).
    """

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.closed_reader = False  # set once the reader was found gone

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stream, name)

    def write(self, text: str) -> int:
        try:
            return self.stream.write(text)
        except BrokenPipeError:
            self._drop_output()
            return len(text)

    def writelines(self, lines: Any) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        try:
            self.stream.flush()
        except BrokenPipeError:
            self._drop_output()

    def _drop_output(self) -> None:
        """Point the stream's descriptor at ``/dev/null``; the buffered text then goes there too."""
        if self.closed_reader:
            return
        self.closed_reader = True
        devnull = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(devnull, self.stream.fileno())
        finally:
            os.close(devnull)
        with contextlib.suppress(OSError, ValueError):
            self.stream.flush()  # what was buffered: to /dev/null, so that it is not written again
        # The console's handler now writes to /dev/null; the job's log file gets the line.
        log.warning(
            f"The reader of this process's {self._label()} has gone (a pipe's end exited: | head, | less): the "
            "console's output is dropped from here and the run goes on; the job's log file has every line."
        )

    def _label(self) -> str:
        """``stdout``, ``stderr`` or ``console``: which of the process's streams this is."""
        names = [name for name in ("stdout", "stderr") if getattr(sys, f"__{name}__", None) is self.stream]
        return names[0] if names else "console"


def drop_output_when_closed() -> None:
    """Guard this process's ``sys.stdout`` and ``sys.stderr`` with :class:`DropsWhenClosed`, once.

    Call it before logging is configured: a handler keeps the stream it was given (Hydra's
    ``ext://sys.stdout``), and Rich's console reads ``sys.stdout`` when it writes.
    """
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if stream is None or isinstance(stream, DropsWhenClosed):
            continue
        try:
            stream.fileno()
        except (AttributeError, OSError, ValueError):  # no descriptor (pytest's capture): nothing to point elsewhere
            continue
        setattr(sys, name, DropsWhenClosed(stream))
