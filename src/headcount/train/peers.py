"""The processes of one job end together, and say why in one line.

With trainer.devices=N on one machine, Lightning's DDP launcher starts the job's extra processes as children of the
first. Left to Lightning, a child that dies makes its observer kill every process, its own too, with SIGKILL: exit code
137, nothing said, the run's lock file left behind; and when the first process dies, the others go on, orphaned, until
a collective fails (a traceback) or, outside one, for as long as they work. Here (`watch`, called by the commands,
and `observe_children`, called where their work starts):

- the first process watches its children in place of Lightning's observer. A child killed by a signal is said in one
  line, the others are killed, the run's lock released, and the command exits 1. A child that exited with an error has
  said it itself: the others are stopped and its exit code kept. A child stopped by Ctrl-C or SIGTERM got the signal
  with this process, which stops on its own; if it is still running after `GRACE_SECONDS` (blocked in a collective the
  child will never join), it is stopped with the line the commands print for that signal;
- an extra process watches its parent, the first: when that is gone, it says so in one line and ends;
- an error a collective raises because a peer died (gloo's "Connection closed by peer") is that same line, not a
  traceback (`peer_gone`, read by the commands' error handler).
Processes that a cluster starts (SLURM's tasks, torchrun's workers) are not children of one another: their scheduler
ends them together.
"""

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable

POLL_SECONDS = 0.5
GRACE_SECONDS = 10.0
PARENT_SECONDS = 2.0
RESUMES = "the same command again resumes where it stopped"
STOPPED = {signal.SIGINT: "interrupted", signal.SIGTERM: "stopped by SIGTERM"}
FIRST_PID = "HEADCOUNT_FIRST_PROCESS_PID"  # set by the first process for the children Lightning's launcher starts


class Peers:
    def __init__(self) -> None:
        self.children: list[subprocess.Popen] = []
        self.ending = threading.Lock()  # whoever ends the job first (the watcher or the main thread) says why
        self.say: Callable[[str], None] = print
        self.before_exit: Callable[[], None] = lambda: None
        self.rank, self.size = "?", "?"  # an extra process's, as the launcher set them
        # an extra process's first process, known at the start: once that is gone this process has another parent,
        # so whether it was a launcher's child cannot be asked again when a collective fails
        self.parent: int | None = None


_peers = Peers()


def launcher_child() -> bool:
    """Whether this process is an extra one that Lightning's launcher started as a child of the job's first."""
    return os.environ.get("LOCAL_RANK", "0") not in ("", "0") and os.environ.get(FIRST_PID) == str(os.getppid())


def watch(say: Callable[[str], None], before_exit: Callable[[], None]) -> None:
    """Before any work: `say` prints a line of why the job ended, `before_exit` releases what must not outlive it."""
    _peers.say, _peers.before_exit = say, before_exit
    if launcher_child():
        # as the launcher set them: Lightning removes WORLD_SIZE when a process tears down
        _peers.rank, _peers.size = os.environ["LOCAL_RANK"], os.environ.get("WORLD_SIZE", "?")
        _peers.parent = int(os.environ[FIRST_PID])
        threading.Thread(target=watch_parent, args=(_peers.parent,), daemon=True, name="headcount-parent").start()
    else:
        os.environ[FIRST_PID] = str(os.getpid())


def observe_children() -> None:
    """Where work starts, before Lightning's launcher can start a child (the commands call it then, not in `watch`:
    Lightning takes seconds to import, and a config is checked before it loads)."""
    from lightning.pytorch.strategies.launchers import subprocess_script

    # Lightning's launcher starts its observer through this module-level name: ours takes its place
    subprocess_script._launch_process_observer = watch_children


def watch_children(children: list[subprocess.Popen]) -> None:
    _peers.children = list(children)
    threading.Thread(target=_watch_children, daemon=True, name="headcount-children").start()


def _watch_children() -> None:
    ended_at: float | None = None
    while True:
        time.sleep(POLL_SECONDS)
        codes = [child.poll() for child in _peers.children]
        if all(code == 0 for code in codes):
            return
        failed = [code for code in codes if code is not None and code != 0]
        if not failed:
            continue
        code = failed[0]
        if stop_signal(code) is not None:  # it reached this process too, unless it is blocked in a collective
            ended_at = ended_at or time.monotonic()
            if time.monotonic() - ended_at > GRACE_SECONDS:
                end(stopped_line(stop_signal(code)), 128 + stop_signal(code))
        elif code < 0:
            end(child_failure(), 1)
        else:  # it printed its own error
            end(None, code)


def stop_signal(code: int) -> int | None:
    """The stop signal (Ctrl-C, SIGTERM) a child's exit code says it ended by, whether it exited (128 + n) or was
    killed by it (-n); None for another ending."""
    signum = code - 128 if code > 128 else -code
    return signum if signum in STOPPED else None


def stopped_line(signum: int) -> str:
    return f"{STOPPED.get(signum, f'stopped by {signal.Signals(signum).name}')}; {RESUMES}"


def child_failure() -> str | None:
    """The line for a child killed by a signal, or stopped by one; None if every child runs."""
    n = len(_peers.children) + 1
    for index, child in enumerate(_peers.children, start=1):
        code = child.poll()
        if code is not None and stop_signal(code) is not None:
            return stopped_line(stop_signal(code))
        if code is not None and code < 0:
            others = "the other was" if n == 2 else "the others were"
            return f"process {index} of {n} was killed by {signal.Signals(-code).name}; {others} stopped: {RESUMES}"
    return None


def watch_parent(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(POLL_SECONDS)
    end(parent_gone_line(parent), 1)


def parent_gone_line(parent: int) -> str:
    return f"process 0 of {_peers.size} ended (pid {parent}); process {_peers.rank} stopped with it: {RESUMES}"


def peer_gone() -> str | None:
    """Why the job cannot go on because one of its processes is gone, as one line; None if none is."""
    if (parent := _peers.parent) is not None:
        # a dead parent's sockets close before this process is handed to another parent: wait for that a moment
        deadline = time.monotonic() + PARENT_SECONDS
        while os.getppid() == parent and time.monotonic() < deadline:
            time.sleep(0.05)
        return None if os.getppid() == parent else parent_gone_line(parent)
    return child_failure()


def claim_ending() -> bool:
    """True for the first to end the job (the main thread's error handler or a watcher), False afterwards."""
    return _peers.ending.acquire(blocking=False)


def end(line: str | None, code: int) -> None:
    """Say why, stop the children, release what must not outlive the job, and exit at once: the main thread may be
    blocked in a collective that never completes."""
    if not claim_ending():
        return  # the main thread is saying it
    if line is not None:
        _peers.say(line)
    for child in _peers.children:
        if child.poll() is None:
            child.send_signal(signal.SIGKILL)  # SIGTERM does not end a process blocked in a collective
    _peers.before_exit()
    sys.stderr.flush()
    os._exit(code)
