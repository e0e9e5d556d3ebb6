"""What a failed job's processes tell: which failure caused the others, and one line for each.

torch's elastic agent (the template's supervisor, and torchrun) reports a failed job as
``{global rank: ProcessFailure}``; the functions here read it.
"""

import re
import signal

from ddp_engine.core.lifetime import STOP_SIGNALS

#: How a collective or the process group's store reports its timeout (gloo: ``Timed out waiting
#: 1800000ms for recv operation``; the TCP store: ``wait timeout after 1800000ms``).
TIMEOUT_PATTERN = re.compile(r"timed out|timeout after|watchdog caught collective operation timeout", re.IGNORECASE)
#: How a process's collective fails when another process of the job died: a consequence, not the cause.
#: Read from the message because nothing else says it: gloo raises a plain ``RuntimeError``
#: ("Connection closed by peer", torch 2.14), with no exception type or attribute of its own.
PEER_LOST_PATTERN = re.compile(
    r"connection closed by peer|connection reset by peer|broken pipe|remote worker crashing|communicator was aborted",
    re.IGNORECASE,
)


def root_failure(failures: dict) -> tuple[int, object]:
    """The failure that caused the others, from torch's ``{global rank: ProcessFailure}``.

    When one process fails, the others fail a moment later as a consequence: their collectives
    lose the connection to it, or the agent's SIGTERM reaches them while they are already ending,
    often within the same second (torch's failure timestamps have 1 s resolution, so its own
    ``get_first_failure`` may name a consequence). So the kinds rank first: an exception of the
    process's own, then death by another signal (SIGKILL: the OOM killer; SIGSEGV), then a stop
    by SIGINT / SIGTERM that the process handled (exit status 128 + the signal), then a death by
    one it did not (the agent's own SIGTERM to the processes left, which a process that was
    already ending no longer handles), then a lost connection; within a kind, the earliest, then
    the lowest rank. (The agent's SIGTERM and the stop it follows can bear the same second, or the
    consequence the earlier one: its exception's record is written before the agent notices.)
    """

    def kind(failure: object) -> int:
        if PEER_LOST_PATTERN.search(describe_failure(failure)):
            return 4
        if recorded_exception(failure):
            return 0
        if -failure.exitcode in STOP_SIGNALS:
            return 3
        if failure.exitcode - 128 in STOP_SIGNALS:
            return 2
        return 1 if failure.exitcode < 0 else 0

    rank = min(failures, key=lambda rank: (kind(failures[rank]), failures[rank].timestamp, rank))
    return rank, failures[rank]


def message_lines(failure) -> list[str]:
    """The non-blank lines of a ``ProcessFailure``'s message: ``"<type>: <message>"`` as the worker
    recorded it (omegaconf adds key details below the first), or torch's text when it recorded none."""
    message = failure.message
    if isinstance(message, dict):  # torch's ErrorHandler format: {"message": "...", "extraInfo": {...}}
        message = message.get("message", "")
    return [line for line in str(message).strip().splitlines() if line.strip()]


def recorded_exception(failure) -> bool:
    """Whether the worker recorded its exception (torch's ``@record``), which torch read back."""
    return failure.error_file_data.get("message") != "<NONE>" and bool(message_lines(failure))


def describe_failure(failure) -> str:
    """One line for a worker's ``ProcessFailure``: the exception's type and message (its first
    line) as the worker recorded it, or the signal that ended it (``killed by SIGKILL (exit status -9)``,
    ``stopped by SIGTERM (exit status 143)``).

    A recorded exception comes first, whatever the exit status: a worker that recorded its exception
    (torch's ``@record``) can still die by a signal on its way out (gloo's threads abort the process
    at interpreter exit after a failed collective: SIGABRT), and the exception is the cause."""
    lines = message_lines(failure)
    if recorded_exception(failure):
        return headed_line(lines)
    if failure.exitcode < 0:
        return f"killed by {failure.signal_name()} (exit status {failure.exitcode})"
    if failure.exitcode - 128 in STOP_SIGNALS:  # a stop: ddp_engine.callbacks.signals
        return f"stopped by {signal.Signals(failure.exitcode - 128).name} (exit status {failure.exitcode})"
    if not lines or "pytorch.org/docs/stable/elastic/errors" in lines[0]:
        return f"exited with status {failure.exitcode}"
    return headed_line(lines)


def headed_line(lines: list[str]) -> str:
    """A message's first line, and its second after a first that ends in a colon: a heading whose
    cause follows (Hydra's ``InstantiationException: Error in call to target 'X':``, then the
    error the target raised), so that the one line names the cause."""
    first = lines[0].strip()
    if first.endswith(":") and len(lines) > 1:
        return f"{first} {lines[1].strip()}"
    return first
