"""Lightning DDP inside one job of a multirun (trainer=ddp in a sweep), where the basic launcher runs every job in the
process that started the sweep.

Lightning's DDP launcher starts one child process per extra device by rerunning the command line with
`hydra.run.dir=<HydraConfig run.dir>` added. In a multirun both are the sweep's (`-m` and every swept value, and the
single-run folder, not this job's), so each child would launch the whole sweep again. For the job's duration both
describe this job as a single run, so the children train this job in its directory (rank 0 alone writes the results).
Afterwards the process group is closed and the environment variables Lightning set (MASTER_PORT, LOCAL_RANK,
WORLD_SIZE, ...) are undone: the next job would otherwise reuse a group whose peers have exited, or take its processes
for ones a cluster started.
"""

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from hydra.core.hydra_config import HydraConfig
from omegaconf import read_write

from headcount.sweep import in_multirun


@contextmanager
def ddp_confined_to_this_job() -> Iterator[None]:
    if not in_multirun():
        yield
        return
    hydra_cfg = HydraConfig.get()
    argv, run_dir, environ = sys.argv, hydra_cfg.run.dir, dict(os.environ)
    sys.argv = [argv[0], *hydra_cfg.overrides.task]
    with read_write(hydra_cfg):
        hydra_cfg.run.dir = hydra_cfg.runtime.output_dir
    try:
        yield
    finally:
        sys.argv = argv
        with read_write(hydra_cfg):
            hydra_cfg.run.dir = run_dir
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
        os.environ.clear()
        os.environ.update(environ)
