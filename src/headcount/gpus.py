"""One GPU per job when several single-GPU jobs of a sweep share a machine (hydra/launcher=parallel, submitit_local).

A job takes an exclusive lock on a free GPU's lock file and holds it while it runs. Job numbers modulo the GPU count
would collide as soon as jobs finish out of order; locks do not, and the kernel drops a lock when its process dies, so
a crashed job never keeps a GPU. The locks live in the machine's temporary folder, so every headcount job on the
machine takes part, whichever sweep it belongs to.
"""

import fcntl
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig
from rich.console import Console

from headcount.sweep import in_multirun

LOCK_DIR = Path(tempfile.gettempdir()) / f"headcount-gpu-locks-{os.getuid()}"


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
