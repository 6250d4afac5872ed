"""Processed text splits on disk, keyed by a fingerprint of everything that shapes them, written atomically."""

import hashlib
import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path

from datasets import DatasetDict, load_from_disk
from omegaconf import OmegaConf

from headcount.config.data import DataConfig
from headcount.errors import ConfigError

# Bump when the processing code changes what a given config produces, so old caches stop matching.
CACHE_FORMAT = 1


def cache_root(cfg: DataConfig) -> Path:
    """The absolute cache folder; resolves the schema's ${oc.env:...} default when a DataConfig is built in Python."""
    raw = str(OmegaConf.create({"cache_dir": cfg.cache_dir}).cache_dir) if "${" in cfg.cache_dir else cfg.cache_dir
    root = Path(raw).expanduser()
    if not root.is_absolute():
        # A relative path would follow the working directory, which differs between runs and Hydra jobs.
        raise ConfigError("data.cache_dir", cfg.cache_dir, "must be an absolute path (or start with ~)")
    return root


def fingerprint(payload: object) -> str:
    blob = json.dumps({"format": CACHE_FORMAT, "payload": payload}, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def load_or_build(root: Path, name: str, build: Callable[[Path], DatasetDict]) -> DatasetDict:
    """Loads <root>/<name>, or builds it first. build(scratch) may leave datasets' own cache files in scratch.

    The build is saved into a temporary folder beside the target and renamed into place, so a crash leaves no
    half-written folder that looks complete; when two processes race, the first rename wins and both load it.
    """
    target = root / name
    if not target.is_dir():
        root.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix=f".{name}.tmp-", dir=root) as work:
            staged = Path(work) / "splits"
            build(Path(work) / "scratch").save_to_disk(str(staged))
            try:
                os.replace(staged, target)
            except OSError:
                if not target.is_dir():
                    raise
    return load_from_disk(str(target))
