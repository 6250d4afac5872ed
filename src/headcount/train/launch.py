"""Launch helpers for a training job that runs inside a Hydra multirun.

One GPU per job, when several single-GPU jobs of a sweep share a machine (hydra/launcher=parallel, submitit_local):
a job takes an exclusive lock on a free GPU's lock file and holds it while it runs. Job numbers modulo the GPU count
would collide as soon as jobs finish out of order; locks do not, and the kernel drops a lock when its process dies, so
a crashed job never keeps a GPU. The locks live in the machine's temporary folder, so every headcount job on the
machine takes part, whichever sweep it belongs to.

DDP inside one job of a multirun (trainer=ddp in a sweep), where the basic launcher runs every job in the process that
started the sweep: Lightning's DDP launcher starts one child process per extra device by rerunning the command line with
`hydra.run.dir=<HydraConfig run.dir>` added. In a multirun both are the sweep's (`-m` and every swept value, and the
single-run folder, not this job's), so each child would launch the whole sweep again. For the job's duration both
describe this job as a single run, so the children train this job in its directory (rank 0 alone writes the results).
Afterwards the process group is closed and the environment variables Lightning set (MASTER_PORT, LOCAL_RANK, WORLD_SIZE,
...) are undone: the next job would otherwise reuse a group whose peers have exited, or take its processes for ones a
cluster started.
"""

import fcntl
import os
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, read_write
from rich.console import Console

LOCK_DIR = Path(tempfile.gettempdir()) / f"headcount-gpu-locks-{os.getuid()}"


def in_multirun() -> bool:
    return HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN


def visible_gpu_ids(n_gpus: int) -> list[str]:
    """Names for the GPUs this process sees (CUDA_VISIBLE_DEVICES entries when set), so two processes with different
    visible sets lock the same physical GPU under the same name."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    ids = [part.strip() for part in visible.split(",")] if visible else [str(i) for i in range(n_gpus)]
    return ids[:n_gpus]


@contextmanager
def claim_gpu(gpu_ids: list[str], preferred: int, lock_dir: Path = LOCK_DIR) -> Iterator[int]:
    """Yields the index into gpu_ids of a GPU no other job holds, trying `preferred` first; when every GPU is held
    (more jobs at once than GPUs), the preferred one, shared rather than waiting."""
    lock_dir.mkdir(parents=True, exist_ok=True)
    n = len(gpu_ids)
    for index in [(preferred + k) % n for k in range(n)]:
        handle = open(lock_dir / f"gpu-{gpu_ids[index]}.lock", "w")  # noqa: SIM115 (held open: the lock lives with it)
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.close()
            continue
        try:
            yield index
        finally:
            handle.close()  # releases the lock
        return
    Console(stderr=True).print(f"[yellow]all {n} GPUs are taken by other jobs: sharing GPU {preferred % n}[/yellow]")
    yield preferred % n


def needs_own_gpu(trainer: DictConfig, n_gpus: int, multirun: bool) -> bool:
    """A single-GPU job of a sweep on a machine with several GPUs: jobs that run at once must not share one. (A job
    with DDP inside takes all its devices; a single run keeps Lightning's usual choice.)"""
    return multirun and n_gpus > 1 and trainer.accelerator in ("gpu", "cuda", "auto") and str(trainer.devices) == "1"


@contextmanager
def own_gpu_in_a_sweep(cfg: DictConfig) -> Iterator[None]:
    """Pins a sweep job to a GPU no other job holds, for Lightning (trainer.devices=[i]) and for torch's default
    device, so the ablations run on it too."""
    n_gpus = torch.cuda.device_count()
    if not needs_own_gpu(cfg.trainer, n_gpus, in_multirun()):
        yield
        return
    job = HydraConfig.get().job.num
    with claim_gpu(visible_gpu_ids(n_gpus), preferred=job % n_gpus) as index:
        cfg.trainer.devices = [index]
        torch.cuda.set_device(index)
        Console(stderr=True).print(f"job {job} runs on GPU {index}")
        yield


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
