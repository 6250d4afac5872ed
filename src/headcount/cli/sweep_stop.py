"""Ctrl-C or SIGTERM to a sweep stops all of its jobs, wherever on this machine they run.

The basic launcher runs every job in the launching process, so a signal reaches the job itself (Lightning ends
training after the step it is in, and the sweep ends with it). The joblib launcher (hydra/launcher=parallel) and
submitit_local run jobs in processes of their own, which a signal to the launching process never reaches: left alone
they would train on, unwatched, after the sweep had "stopped". `StopJobsTogether`, a callback in the launching
process, catches SIGINT and SIGTERM while such a sweep runs and passes the signal on to every process the launcher
started (but the helpers in PASSED_OVER), so each job stops as it would on its own; it waits until no job of the
sweep holds its run's lock (at most GRACE_S), kills whatever of those processes is left (idle workers, jobs that did
not stop), and exits with 128 + the signal number. Unfinished jobs have no DONE, so the same command again finishes
them and skips the finished ones. A second signal while the sweep stops kills everything at once.
"""

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path
from types import FrameType
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig
from rich.console import Console

from headcount import run_lock
from headcount.errors import ConfigError

LOCAL_LAUNCHERS = (".JoblibLauncher", ".LocalLauncher")  # launchers whose jobs run in other processes of this machine
SIGNALS = (signal.SIGINT, signal.SIGTERM)
GRACE_S = 60.0  # how long jobs get to stop (and save their state) before they are killed
# Processes a launcher starts that run no job and end by themselves once the jobs or the launcher have: submitit's
# controller (on SIGINT it would kill its job a second later, before the job could save its state) and the
# multiprocessing resource trackers (which would report, at length, resources they no longer know).
PASSED_OVER = ("submitit.local._local", "resource_tracker")


def process_table() -> dict[int, tuple[int, str]]:
    """pid -> (parent pid, command line) of every process this user can see: from /proc, else from `ps`."""
    table = {}
    if Path("/proc/self/stat").exists():
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                stat = (entry / "stat").read_text()
                args = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except (OSError, ValueError):
                continue  # not a process, or one that just ended
            table[int(entry.name)] = (int(stat.rsplit(")", 1)[1].split()[1]), args)
        return table
    lines = subprocess.run(["ps", "-A", "-o", "pid=,ppid=,args="], capture_output=True, text=True).stdout
    for line in lines.splitlines():
        pid, ppid, *args = line.split(None, 2)
        table[int(pid)] = (int(ppid), args[0] if args else "")
    return table


def descendants(pid: int) -> dict[int, str]:
    """pid -> command line of every process below pid."""
    table = process_table()
    found: dict[int, str] = {}
    parents = {pid}
    while parents:
        children = {child for child, (ppid, _) in table.items() if ppid in parents and child not in found}
        found.update({child: table[child][1] for child in children})
        parents = children
    return found


def send(pids: list[int], signum: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):  # ended meanwhile
            os.kill(pid, signum)


def jobs_running(sweep_dir: Path) -> bool:
    """Whether any run of the sweep is still held by its job (a job lets go of its lock when it ends, however)."""
    for lock in sweep_dir.glob(f"*/{run_lock.LOCK_NAME}"):
        try:
            run_lock.check_free(lock.parent, "run", str(lock.parent))
        except ConfigError:
            return True
    return False


class StopJobsTogether(Callback):
    """While a sweep runs its jobs in other processes: SIGINT or SIGTERM stops them all, then the sweep."""

    def __init__(self) -> None:
        self.previous: dict[int, Any] = {}
        self.sweep_dir = Path()
        self.stopping = False

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        if not str(config.hydra.launcher._target_).endswith(LOCAL_LAUNCHERS):
            return
        self.sweep_dir, self.stopping = Path(config.hydra.sweep.dir), False
        self.previous = {signum: signal.signal(signum, self.stop) for signum in SIGNALS}

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        for signum, handler in self.previous.items():
            signal.signal(signum, handler)
        self.previous = {}

    def stop(self, signum: int, frame: FrameType | None) -> None:
        console = Console(stderr=True)
        name = signal.Signals(signum).name
        processes = descendants(os.getpid())
        if self.stopping:
            send(list(processes), signal.SIGKILL)
            console.print(f"[red]{name} again: killed {len(processes)} job processes[/red]")
            raise SystemExit(128 + signum)
        self.stopping = True
        workers = [pid for pid, args in processes.items() if not any(name in args for name in PASSED_OVER)]
        console.print(f"[yellow]{name}: stopping the sweep's jobs...[/yellow]")
        send(workers, signum)
        deadline = time.monotonic() + GRACE_S
        while time.monotonic() < deadline and jobs_running(self.sweep_dir):
            time.sleep(0.2)
        send(workers, signal.SIGKILL)
        console.print("[yellow]sweep stopped:[/yellow] the same command again finishes the unfinished jobs")
        raise SystemExit(128 + signum)
