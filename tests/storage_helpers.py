"""Storage that refuses writes, for the tests of faults of the machine: a disk that fills up and a read-only folder.

Real conditions where the tests may create them (as root: a small tmpfs, a read-only bind mount); otherwise the
closest stand-in (a non-root user: permissions make a folder read-only; a disk that fills up is a patched writer that
raises ENOSPC once the room is used, through the same code path, since every file headcount writes goes through
headcount.io). Which one ran is in the fixture's `real` attribute.
"""

import errno
import os
import shutil
import stat
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from headcount import io as headcount_io


def can_mount() -> bool:
    return os.geteuid() == 0 and shutil.which("mount") is not None


def run(*command: str) -> bool:
    return subprocess.run(command, capture_output=True).returncode == 0


class SmallDisk:
    """A folder on a disk with `room` bytes: `fill()` uses up the room left, `free()` makes plenty."""

    def __init__(self, path: Path, room: int, monkeypatch: pytest.MonkeyPatch):
        self.path, self.monkeypatch = path, monkeypatch
        path.mkdir(parents=True, exist_ok=True)
        self.real = can_mount() and run("mount", "-t", "tmpfs", "-o", f"size={room}", "tmpfs", str(path))
        if not self.real:
            self.room, self.used = room, 0
            monkeypatch.setattr(headcount_io.os, "fdopen", self._fdopen)

    def _fdopen(self, fd: int, mode: str = "r", *args, **kwargs):
        """os.fdopen whose files under this folder count what they write and raise ENOSPC past the room."""
        file = open(fd, mode, *args, **kwargs)  # noqa: SIM115 (returned open, as os.fdopen does)
        if Path(os.readlink(f"/proc/self/fd/{fd}")).is_relative_to(self.path):
            write = file.write

            def counted(data):
                if self.used + len(data) > self.room:
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
                self.used += len(data)
                return write(data)

            file.write = counted
        return file

    def fill(self) -> None:
        if not self.real:
            self.room = self.used
            return
        with open(self.path / ".filler", "wb") as f:
            try:
                while True:
                    f.write(b"\0" * 65536)
                    f.flush()
            except OSError:
                pass

    def free(self) -> None:
        if not self.real:
            self.room = 2**62
            return
        (self.path / ".filler").unlink(missing_ok=True)
        assert run("mount", "-o", "remount,size=64m", str(self.path))

    def close(self) -> None:
        if self.real:
            run("umount", "-l", str(self.path))


@contextmanager
def read_only(folder: Path) -> Iterator[bool]:
    """folder (and all below it) read-only while the block runs: a read-only bind mount, which stops root too, where
    mounting is allowed; permissions otherwise (which stop everyone but root). Yields whether it was a mount."""
    folder = Path(folder)
    if can_mount() and run("mount", "--bind", str(folder), str(folder)):
        try:
            assert run("mount", "-o", "remount,bind,ro", str(folder))
            yield True
        finally:
            run("umount", "-l", str(folder))  # lazy: files the process still maps (datasets) keep it busy
        return
    if os.geteuid() == 0:
        pytest.skip("read-only storage needs a mount as root (permissions do not stop root)")
    modes = {p: p.stat().st_mode for p in [folder, *folder.rglob("*")]}
    for path, mode in modes.items():
        path.chmod(mode & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))
    try:
        yield False
    finally:
        for path, mode in modes.items():
            path.chmod(mode)
