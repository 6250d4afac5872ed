"""One writer per run directory: headcount-train and headcount-ablate hold <run>/.lock while they work on a run.

The lock is the operating system's (flock on the lock file), so the kernel drops it when its process ends, however it
ends: a crash never leaves a lock that blocks. The file also names its holder (command, pid, host, start time), for the
line a second process prints when it is refused, and so that a file left behind by a process that died is noticed
and taken over with a one-line notice. A holder removes the file when it lets go; another process may have opened the
file just before, so whoever gets the lock checks that the file it locked is still the one at the path, else retries.

A process holds each run's lock once (`acquire` is idempotent), until `release` or its exit (at exit, the file goes
too; only a killed process leaves it behind).
"""

import atexit
import contextlib
import fcntl
import json
import os
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from rich.console import Console
from rich.markup import escape

from headcount.errors import ConfigError
from headcount.io import WriteError, writable

LOCK_NAME = ".lock"

_held: dict[Path, IO[str]] = {}  # run directory (resolved) -> its open, locked lock file


@dataclass(frozen=True)
class Holder:
    command: str
    pid: int
    host: str
    since: str

    def __str__(self) -> str:
        return f"{self.command} (pid {self.pid} on {self.host} since {self.since})"


def lock_path(run_dir: Path) -> Path:
    return Path(run_dir) / LOCK_NAME


def read_holder(path: Path) -> Holder | None:
    """Who the lock file names, or None while it is empty (its holder has not written it yet) or gone."""
    try:
        return Holder(**json.loads(path.read_text()))
    except (OSError, ValueError, TypeError):
        return None


def _locked_file(path: Path, key: str, value: str) -> IO[str]:
    """The lock file at path, opened and locked; ConfigError naming the holder if another process has it."""
    while True:
        handle = open(path, "a+")  # noqa: SIM115 (held open: the lock lives as long as the file object)
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.close()
            holder = read_holder(path)
            who = str(holder) if holder else "another headcount process"
            raise ConfigError(key, value, f"in use by {who}; wait for it to finish or stop it") from None
        try:
            same_file = os.fstat(handle.fileno()).st_ino == os.stat(path).st_ino
        except FileNotFoundError:
            same_file = False
        if same_file:
            return handle
        handle.close()  # its holder let go and removed it between our open and our lock: take the new one


def acquire(run_dir: Path, command: str, key: str = "run_dir") -> None:
    """Take run_dir's lock (creating the folder if needed) for this process; ConfigError(key) if another holds it.
    A lock file left by a process that has ended is taken over with a one-line notice."""
    run_dir = Path(run_dir).resolve()
    if run_dir in _held:
        return
    run_dir.mkdir(parents=True, exist_ok=True)
    path = lock_path(run_dir)
    handle = _locked_file(path, key, str(run_dir))
    left_behind = read_holder(path)
    if left_behind is not None:
        Console(stderr=True).print(
            f"[yellow]notice:[/yellow] taking over the lock of {escape(str(run_dir))} left by "
            f"{escape(str(left_behind))}, which has ended",
            soft_wrap=True,
            highlight=False,
        )
    me = Holder(command, os.getpid(), socket.gethostname(), time.strftime("%Y-%m-%d %H:%M:%S"))
    try:
        handle.seek(0)
        handle.truncate()
        handle.write(json.dumps(me.__dict__))
        handle.flush()
    except OSError as error:  # a full disk: let go, leaving no lock file that names nobody
        path.unlink(missing_ok=True)
        with contextlib.suppress(OSError):  # closing flushes what the disk refused again; the file closes anyway
            handle.close()
        raise WriteError(path, error) from error
    _held[run_dir] = handle


def acquire_if_writable(run_dir: Path, command: str, key: str = "run_dir") -> bool:
    """acquire, where the run directory can be written; on read-only storage (an archive, a shared folder mounted
    read-only), where no lock file can be made, only check that no other process holds one: a process that cannot
    write there only reads, and any write it then tries fails on its own. Returns whether the lock was taken."""
    if writable(run_dir):
        acquire(run_dir, command, key)
        return True
    check_free(Path(run_dir), key, str(run_dir))
    return False


def release(run_dir: Path) -> None:
    """Let go of run_dir's lock if this process holds it; the file goes first, so nobody reads a stale holder."""
    handle = _held.pop(Path(run_dir).resolve(), None)
    if handle is not None:
        lock_path(Path(run_dir)).unlink(missing_ok=True)
        handle.close()


def release_all() -> None:
    for run_dir in list(_held):
        release(run_dir)


atexit.register(release_all)  # a process that exits by an exception (Ctrl-C, SIGTERM in training) lets go cleanly


def holds(run_dir: Path) -> bool:
    return Path(run_dir).resolve() in _held


def check_free(run_dir: Path, key: str, value: str) -> None:
    """ConfigError(key, value) naming the holder if another process holds run_dir's lock; takes nothing."""
    path = lock_path(run_dir)
    if holds(run_dir) or not path.exists():
        return
    with open(path) as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = read_holder(path)
            who = str(holder) if holder else "another headcount process"
            raise ConfigError(key, value, f"{run_dir} is in use by {who}; wait for it to finish or stop it") from None
