"""Files written atomically: a reader, or a kill during the write, sees the old file or the whole new one."""

import csv
import errno
import io
import json
import os
import secrets
import shutil
import tempfile
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from ddp_engine.core.errors import ConfigValueError

#: The errors of a write that found no space: the file system is full, or the user's quota is.
NO_SPACE = (errno.ENOSPC, errno.EDQUOT)


class NoSpaceError(OSError):
    """A write that failed for lack of space, as one line: the cause, the path, the space left and,
    where known, the bytes the file needed (:func:`atomic_path`)."""


def out_of_space(error: BaseException) -> OSError | None:
    """The no-space ``OSError`` behind ``error``: itself, or one it was raised from or while handling
    (torch's checkpoint writer reports the file's own error as the context of a ``RuntimeError``);
    None when there is none."""
    seen: BaseException | None = error
    while seen is not None:
        if isinstance(seen, OSError) and seen.errno in NO_SPACE:
            return seen
        seen = seen.__cause__ or seen.__context__
    return None


def byte_size(count: float) -> str:
    """``count`` bytes as a person reads it: ``512 B``, ``20.0 kB``, ``1.5 GB`` (powers of 1000)."""
    if count < 1000:
        return f"{count:.0f} B"
    for unit in ("kB", "MB", "GB"):
        count /= 1000
        if count < 1000 or unit == "GB":
            break
    return f"{count:.1f} {unit}"


@contextmanager
def atomic_path(
    path: Path, suffix: str = ".partial", durable: bool = False, replace: bool = True, needed: int | None = None
) -> Iterator[Path]:
    """A temporary path beside ``path`` to write the whole file into; when the block ends without
    an error, the file takes the name ``path``; otherwise it is removed.

    The one way this template writes a file that another process, or the user, may read while it
    is written, or that a kill may interrupt: the path holds the old file or the whole new one,
    never a part. The temporary file is ``.<name>.<pid>.<random><suffix>`` in the same folder (a
    rename is atomic within one filesystem only; a node-local ``/tmp`` and a shared run folder are
    two), named by process and at random so that processes writing the same file at once do not
    write into each other's, and created by the writer with the permissions of any new file (not
    ``tempfile.mkstemp``'s, private to their owner).

    Args:
        path: the final path; its folder is created.
        suffix: the temporary file's ending (an exporter may want the format's own).
        durable: flush the file and the folder's entry to disk (``fsync``), so that the new file
            survives a power loss too (checkpoints); off by default.
        replace: False: never over an existing file; it is given its name with a hard link, which
            fails when ``path`` exists (or, where the filesystem has none, a rename after a check).
        needed: the file's size in bytes where the writer knows it, for the message of a write
            that finds no space.

    Raises:
        FileExistsError: with ``replace=False``, when ``path`` exists; nothing is written.
        NoSpaceError: when the write (or its flush) found no space on the file system or in the
            user's quota: one line naming the path, the space left and ``needed``; nothing is written.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}{suffix}")
    try:
        try:
            yield temporary
            if durable:
                with open(temporary, "rb") as file:
                    os.fsync(file.fileno())
            if replace:
                os.replace(temporary, path)
            else:
                _link_new(temporary, path)
            if durable:  # the rename itself reaches the disk with the folder's entry
                folder = os.open(path.parent, os.O_RDONLY)
                try:
                    os.fsync(folder)
                finally:
                    os.close(folder)
        except Exception as error:
            if isinstance(error, NoSpaceError) or (cause := out_of_space(error)) is None:
                raise
            temporary.unlink(missing_ok=True)  # its space back before the space left is measured
            needs = f"; the file needs about {byte_size(needed)}" if needed else ""
            left = f"{byte_size(shutil.disk_usage(path.parent).free)} left on its file system{needs}"
            raise NoSpaceError(cause.errno, f"{os.strerror(cause.errno)}: writing {path} failed ({left})") from error
    finally:
        temporary.unlink(missing_ok=True)


def _link_new(temporary: Path, path: Path) -> None:
    """Give ``temporary`` the name ``path`` too, never over an existing file (see :func:`atomic_path`)."""
    try:
        os.link(temporary, path)
    except OSError as error:
        if error.errno not in (errno.EPERM, errno.EOPNOTSUPP, errno.ENOTSUP):
            raise  # FileExistsError among them
        if path.exists():
            raise FileExistsError(errno.EEXIST, "File exists", str(path)) from None
        os.replace(temporary, path)


def write_atomically(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` atomically (:func:`atomic_path`)."""
    with atomic_path(path) as temporary:
        temporary.write_text(text)


def write_json(path: Path, data: dict) -> None:
    """Write ``data`` to ``path`` as JSON, atomically (:func:`write_atomically`)."""
    write_atomically(path, json.dumps(data, indent=2) + "\n")


def update_json(path: Path, entries: dict) -> None:
    """Merge ``entries`` into the JSON object in ``path`` (an empty one where there is none), written
    atomically (:func:`write_json`): a file several callbacks add their keys to (``ddp.json``)."""
    data = json.loads(path.read_text()) if path.is_file() else {}
    write_json(path, data | entries)


def write_csv(path: Path, header: Sequence[str], rows: Iterable[Sequence[object]]) -> None:
    """Write a CSV file (``header``, then ``rows``; Python's ``csv`` dialect ``excel``), atomically
    (:func:`write_atomically`)."""
    text = io.StringIO()
    writer = csv.writer(text, lineterminator="\n")
    writer.writerow(header)
    writer.writerows(rows)
    write_atomically(path, text.getvalue())


def check_writable(key: str, folder: Path) -> None:
    """Refuse an output folder this process cannot create or write into, before anything is written.

    Nothing is created: the check writes a temporary file into ``folder``, or into its nearest
    existing parent when it does not exist yet, and removes it.

    Raises:
        ConfigValueError: naming ``key``, the folder and the reason.
    """
    existing = folder
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    try:
        if not existing.is_dir():
            raise NotADirectoryError(f"{existing} is a file")
        tempfile.TemporaryFile(dir=existing).close()
    except OSError as error:
        reason = error.strerror or str(error)
        raise ConfigValueError(
            f"{key}={folder} cannot be written (creating a file in {existing}: {reason}). "
            f"Point {key} at a folder you can write, e.g. {key}=$HOME/logs."
        ) from None
