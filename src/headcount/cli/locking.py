"""One writer per run for headcount-train (run_lock.py): a Hydra callback that takes the run directory's lock.

A single run's lock is taken before Hydra writes anything into the folder (on_run_start), so a second process there
neither overwrites the first one's .hydra/config.yaml nor trains beside it: it gets one line naming the holder and
exit code 2. A sweep job takes its folder's lock when it starts (on_job_start); the sweep has already checked, before
its first job, that no folder of it is in use (cli/sweep.py). DDP's extra processes rerun the command to train their
parent's run: only rank 0 holds the lock.
"""

from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from hydra.types import RunMode
from omegaconf import DictConfig

from headcount import run_lock
from headcount.cli.errors import print_error
from headcount.errors import ConfigError

COMMAND = "headcount-train"


def acquire_or_exit(run_dir: Path, key: str) -> None:
    """Hydra turns an Exception raised by a callback into a warning and goes on, so a refusal leaves as SystemExit."""
    try:
        run_lock.acquire(run_dir, COMMAND, key)
    except ConfigError as error:
        print_error(str(error))
        raise SystemExit(2) from error


def rank() -> int:
    """Lightning's rank of this process. Imported when asked: the callbacks before this one (ValidateJobsFirst) check
    the config before Lightning loads."""
    from lightning.fabric.utilities.rank_zero import rank_zero_only

    return rank_zero_only.rank


class OneWriterPerRun(Callback):
    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        if rank() == 0:
            acquire_or_exit(Path(config.hydra.run.dir), "hydra.run.dir")

    def on_run_end(self, config: DictConfig, **kwargs: Any) -> None:
        run_lock.release(Path(config.hydra.run.dir))

    def on_job_start(self, config: DictConfig, **kwargs: Any) -> None:
        if config.hydra.mode == RunMode.MULTIRUN and rank() == 0:
            acquire_or_exit(Path(config.hydra.runtime.output_dir), "hydra.sweep.dir")

    def on_job_end(self, config: DictConfig, **kwargs: Any) -> None:
        if config.hydra.mode == RunMode.MULTIRUN:
            run_lock.release(Path(config.hydra.runtime.output_dir))
