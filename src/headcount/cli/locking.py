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
from lightning.fabric.utilities.rank_zero import rank_zero_only
from omegaconf import DictConfig

from headcount import run_lock

COMMAND = "headcount-train"


class OneWriterPerRun(Callback):
    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        if rank_zero_only.rank == 0:
            run_lock.acquire(Path(config.hydra.run.dir), COMMAND, "hydra.run.dir")

    def on_run_end(self, config: DictConfig, **kwargs: Any) -> None:
        run_lock.release(Path(config.hydra.run.dir))

    def on_job_start(self, config: DictConfig, **kwargs: Any) -> None:
        if config.hydra.mode == RunMode.MULTIRUN and rank_zero_only.rank == 0:
            run_lock.acquire(Path(config.hydra.runtime.output_dir), COMMAND, "hydra.sweep.dir")

    def on_job_end(self, config: DictConfig, **kwargs: Any) -> None:
        if config.hydra.mode == RunMode.MULTIRUN:
            run_lock.release(Path(config.hydra.runtime.output_dir))
