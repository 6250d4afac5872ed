"""Experiment loggers for training: CSV by default, W&B on request.

W&B never blocks a run: without an API key it logs offline; with a key it first checks within seconds that the server
answers, and logs offline (saying so in one line) when it does not, or when starting the run fails in any other way (a
server that is not W&B, a key it refuses). Offline runs upload later with `wandb sync <run>/wandb/offline-run-*`. The
W&B run id is kept in `<run>/wandb_id.txt`, so a resumed job continues the same W&B run. W&B's own notices show only
with -v (train/quiet.py).

The CSV logger is train/curves.py's: metrics.csv survives resumes.
"""

import logging
import netrc
import os
import secrets
import socket
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlparse
from urllib.request import getproxies

from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf
from rich.console import Console
from rich.markup import escape

from headcount.io import atomic_write_text
from headcount.train.launch import in_multirun

DEFAULT_WANDB_URL = "https://api.wandb.ai"
REACHABLE_TIMEOUT_S = 3.0

if TYPE_CHECKING:
    from lightning.pytorch.loggers import Logger


def has_api_key(base_url: str) -> bool:
    if os.environ.get("WANDB_API_KEY"):
        return True
    try:  # `wandb login` stores the key in ~/.netrc
        return netrc.netrc().authenticators(urlparse(base_url).hostname or "") is not None
    except (OSError, netrc.NetrcParseError):
        return False


def reachable(url: str, timeout: float = REACHABLE_TIMEOUT_S) -> bool:
    """Whether a TCP connection to the URL's host (or to the proxy configured for its scheme, the way W&B's own
    requests will go) opens within `timeout` seconds."""
    parts = urlparse(getproxies().get(urlparse(url).scheme) or url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        with socket.create_connection((parts.hostname, port), timeout=timeout):
            return True
    except OSError:
        return False


def requested_wandb_mode(requested: str) -> str:
    """online | offline | disabled. auto: WANDB_MODE if set, else online with an API key, else offline."""
    if requested == "auto":
        return os.environ.get("WANDB_MODE") or ("online" if has_api_key(wandb_base_url()) else "offline")
    return requested


def wandb_mode(requested: str, console: Console | None = None) -> str:
    """The requested mode (see requested_wandb_mode), except that a run asked to be online whose server does not
    answer within seconds goes offline and says so, rather than hanging."""
    console = console or Console(stderr=True)
    mode = requested_wandb_mode(requested)
    if mode == "online" and not reachable(wandb_base_url()):
        console.print(
            f"[yellow]W&B: {wandb_base_url()} does not answer; logging offline (upload later with wandb sync)[/yellow]"
        )
        return "offline"
    return mode


def wandb_base_url() -> str:
    return os.environ.get("WANDB_BASE_URL", DEFAULT_WANDB_URL)


def wandb_run_id(run_dir: Path) -> str:
    """The run's W&B id from wandb_id.txt, created on first use, so a resumed job continues the same W&B run."""
    from lightning.fabric.utilities.rank_zero import rank_zero_only

    path = run_dir / "wandb_id.txt"
    if path.exists():
        return path.read_text().strip()
    run_id = secrets.token_hex(6)
    if rank_zero_only.rank == 0:  # DDP children never start a W&B run
        atomic_write_text(path, run_id + "\n")
    return run_id


def wandb_group(cfg: DictConfig) -> str | None:
    """The sweep's folder name for the jobs of a multirun (the report and the run table then group alike), else the
    experiment."""
    if cfg.logger.wandb.group:
        return cfg.logger.wandb.group
    return Path(HydraConfig.get().sweep.dir).name if in_multirun() else cfg.experiment


def wandb_run_name(cfg: DictConfig) -> str | None:
    """The command-line overrides (`model.attn.n_heads=4,seed=1`): what sets this run apart from its sweep."""
    if cfg.logger.wandb.name:
        return cfg.logger.wandb.name
    return (HydraConfig.get().job.override_dirname or None) if HydraConfig.initialized() else None


def make_logger(cfg: DictConfig, run_dir: Path) -> "Logger | None":
    # Lightning is imported here, not at the top: `headcount-report` uses this module and starts faster without it.
    from lightning.fabric.utilities.rank_zero import rank_zero_only

    from headcount.train.curves import AppendOnlyCSVLogger

    if cfg.logger.kind == "none":
        return None
    if cfg.logger.kind == "csv":
        return AppendOnlyCSVLogger(save_dir=run_dir, name="logs", version="")
    mode, problem, logger = requested_wandb_mode(cfg.logger.wandb.mode), None, None
    if mode == "online" and not reachable(wandb_base_url()):
        problem = "does not answer"
    else:
        try:
            logger = started_wandb_logger(cfg, run_dir, mode)
        except Exception as error:  # W&B fails at start in many ways (CommError, AuthenticationError, UsageError, ...)
            if mode != "online":
                raise
            import wandb

            wandb.teardown()  # W&B's service holds on to the failed run's id; the offline run starts a fresh one
            # W&B's telemetry keeps posting to the server that refused the run, and logs each failure at exit.
            logging.getLogger("opentelemetry").setLevel(logging.CRITICAL)
            problem = f"refused the run ({first_line(error)})"
    if problem is not None:
        mode, logger = "offline", started_wandb_logger(cfg, run_dir, "offline")
    if mode == "offline" and rank_zero_only.rank == 0:
        why = (
            f"[yellow]W&B: {wandb_base_url()} {escape(problem)}; logging offline[/yellow]: "
            if problem
            else "W&B offline: "
        )
        sync = f"upload later with [bold]wandb sync {run_dir}/wandb/offline-run-*[/bold]"
        Console(stderr=True).print(why + sync, soft_wrap=True)
    return logger


def first_line(error: BaseException, width: int = 100) -> str:
    text = str(error).strip()
    line = text.splitlines()[0] if text else type(error).__name__
    return line if len(line) <= width else line[: width - 3] + "..."


def started_wandb_logger(cfg: DictConfig, run_dir: Path, mode: str) -> "Logger":
    """A WandbLogger whose run has started (the first contact with the server), its config logged."""
    from lightning.pytorch.loggers import WandbLogger

    w = cfg.logger.wandb
    logger = WandbLogger(
        project=w.project,
        entity=w.entity,
        group=wandb_group(cfg),
        name=wandb_run_name(cfg),
        tags=list(w.tags),
        save_dir=str(run_dir),
        id=wandb_run_id(run_dir),
        mode=mode,
    )
    # Lightning passes anonymous=None, which W&B answers with a deprecation notice in every run: pass nothing.
    logger._wandb_init.pop("anonymous", None)
    logger.log_hyperparams(OmegaConf.to_container(cfg, resolve=True, enum_to_str=True))
    return logger


@contextmanager
def closing_wandb_run() -> Iterator[None]:
    """Finishes the job's W&B run, if it opened one, however the job ends, so the next job in the same process (the
    basic launcher runs them all in one) starts its own; then stops W&B's service process, which writes the run's files
    after finish() returns: the job ends with them complete on disk, even in a launcher worker whose exit hooks may
    not run. A job that never used W&B never imported it: no need to pay for the import here."""
    failed = True
    try:
        yield
        failed = False
    finally:
        if "wandb" in sys.modules and (wandb := sys.modules["wandb"]).run is not None:
            wandb.finish(exit_code=1 if failed else 0)
            wandb.teardown()
