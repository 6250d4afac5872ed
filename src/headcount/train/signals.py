"""Stop requests: a signal asks a training run to stop at the next step boundary, where it writes last.ckpt and exits.

A signal handler runs between two Python instructions, anywhere in a step: stopping there (Python's KeyboardInterrupt,
Lightning's SIGTERM exception after the step's validation) leaves no consistent point to resume from, or none saved.
So SIGINT (Ctrl-C) and SIGTERM (`kill`, SLURM before it kills or requeues a job) only record the request here, and
the checkpoint callback (train/checkpointing.py) acts on it when the step is complete. A second Ctrl-C exits at once.

The signal a launcher catches to requeue a job before its time limit or on preemption (submitit's USR2, as
hydra/launcher=slurm asks SLURM to send) is deferred the same way when the process has a handler for it: the
checkpoint is written first, then the launcher's own handler runs (it requeues the job and exits).
"""

import signal
import sys
import threading
from collections.abc import Callable
from types import FrameType

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
LAUNCHER_SIGNALS = (signal.SIGUSR1, signal.SIGUSR2)


class StoppedBySignal(SystemExit):
    """Raised once the checkpoint is written. A SystemExit, not an Exception: a sweep stops rather than going on to its
    next job, and the exit status is the shell's for the signal (130 for Ctrl-C, 143 for SIGTERM)."""

    def __init__(self, signum: int):
        super().__init__(128 + signum)
        self.signum = signum


class StopRequests:
    """Records the first stop signal while installed (between `install` and `uninstall`, in the main thread)."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self._previous: dict[int, Callable | int | None] = {}

    def install(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return  # signals reach the main thread only (a run inside a launcher's worker thread keeps its handlers)
        for signum in STOP_SIGNALS:
            self._previous[signum] = signal.signal(signum, self._request)
        for signum in LAUNCHER_SIGNALS:
            if callable(signal.getsignal(signum)):
                self._previous[signum] = signal.signal(signum, self._request)

    def uninstall(self) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler if handler is not None else signal.SIG_DFL)
        self._previous = {}

    def _request(self, signum: int, frame: FrameType | None) -> None:
        if signum == signal.SIGINT and self.signum is not None:
            sys.stderr.write("\nSIGINT: exiting now, without a checkpoint\n")
            raise KeyboardInterrupt
        if self.signum is None:
            self.signum = signum
            name = signal.Signals(signum).name
            then = " (Ctrl-C again to exit at once, without a checkpoint)" if signum == signal.SIGINT else ""
            sys.stderr.write(f"\n{name}: stopping after this step, once last.ckpt is written{then}\n")

    def launcher_handler(self, signum: int) -> Callable | None:
        """The launcher's own handler for a deferred requeue signal, to call once the checkpoint is written."""
        handler = self._previous.get(signum)
        return handler if signum in LAUNCHER_SIGNALS and callable(handler) else None
