"""Atomic file writes: a temporary file renamed into place, so a crash never leaves a half-written file that looks
complete. A write the machine refuses (disk full, read-only storage, no permission) leaves no temporary file either,
and raises WriteError naming the file, which the commands print as one line. In a multi-process job (a distributed
scan) only the first process writes: headcount.processes."""

import contextlib
import errno
import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from headcount.processes import first_process

# Faults of the machine or its storage, not of headcount or of the user's input: the file could not be written.
MACHINE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS, errno.EACCES, errno.EPERM, errno.EIO})
READ_ONLY_ERRNOS = frozenset({errno.EROFS, errno.EACCES, errno.EPERM})
ONLY_ON_WRITES = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS})


class WriteError(OSError):
    """A file could not be written for a reason of the machine; the file at `filename` is as it was before."""

    def __init__(self, path: str | Path, cause: OSError):
        super().__init__(cause.errno, cause.strerror or str(cause), str(path))


def machine_fault(error: BaseException) -> OSError | None:
    """The OSError of the machine behind an error, following its causes and contexts (torch's zip writer, out of
    disk, raises `RuntimeError ... unexpected pos` with the OSError as its context); None if there is none."""
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, OSError) and error.errno in MACHINE_ERRNOS:
            return error
        error = error.__cause__ or error.__context__
    return None


def write_fault(error: BaseException) -> OSError | None:
    """What the commands report as a refused write: a WriteError in the error's chain, or an OSError that only a
    write raises (disk full, read-only storage) from a writer that does not go through atomic_write (an appended CSV
    row, a log file, a library's cache); None otherwise (a permission denied may have been a read)."""
    seen: set[int] = set()
    link: BaseException | None = error
    while link is not None and id(link) not in seen:
        seen.add(id(link))
        if isinstance(link, WriteError):
            return link
        link = link.__cause__ or link.__context__
    fault = machine_fault(error)
    return fault if fault is not None and fault.errno in ONLY_ON_WRITES else None


def raise_as_write_error(path: Path, error: BaseException) -> None:
    """WriteError for a machine's refusal to write path; anything else is raised as it is."""
    if isinstance(error, WriteError):
        raise error
    if (fault := machine_fault(error)) is not None:
        raise WriteError(path, fault) from error
    raise error


def discard(tmp: Path) -> None:
    """Remove a temporary file a failed write left; a storage that refuses even that keeps it (hidden, not final)."""
    with contextlib.suppress(OSError):
        tmp.unlink(missing_ok=True)


def atomic_write(
    path: str | Path, write: Callable[[IO], None], binary: bool = False, every_process: bool = False
) -> None:
    """Call write(file) on a temporary file in path's folder, then rename it to path. In a multi-process job only the
    first process writes (headcount.processes), unless every_process: a file each process keeps for itself."""
    if not (every_process or first_process()):
        return
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as error:
        raise_as_write_error(path, error)
    try:
        with os.fdopen(fd, "wb" if binary else "w") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as error:
        discard(Path(tmp))
        raise_as_write_error(path, error)


def atomic_write_text(path: str | Path, text: str, every_process: bool = False) -> None:
    atomic_write(path, lambda f: f.write(text), every_process=every_process)


def atomic_write_json(path: str | Path, obj: Any) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True) + "\n")


def atomic_savefig(fig: Any, path: str | Path, **kwargs: Any) -> None:
    """matplotlib's savefig through a temporary file in the same folder (by the first process of a job only)."""
    if not first_process():
        return
    path = Path(path)
    tmp = path.with_name(f".{path.stem}.tmp{path.suffix}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(tmp, **kwargs)
        os.replace(tmp, path)
    except BaseException as error:
        discard(tmp)
        raise_as_write_error(path, error)


def writable(folder: str | Path) -> bool:
    """Whether files can be created in folder, or in the nearest folder above it that exists (which would hold it).
    Read-only storage says no even to root; permissions say no to everyone else."""
    folder = Path(folder).absolute()
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    return folder.is_dir() and os.access(folder, os.W_OK | os.X_OK)
