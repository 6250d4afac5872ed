"""Processed text splits on disk, keyed by a fingerprint of everything that shapes them, written atomically, with a
checksum of every file they hold.

An entry is checked against its checksums.json before it is read: a damaged or truncated entry (a disk error, a copy
cut short, a file edited by hand) is set aside and rebuilt, with a one-line warning, instead of failing deep inside
Arrow. An entry written before entries carried checksums is read as it is and gets its checksums then (rebuilding it
could need the network, for hub data); if it cannot be read, it is rebuilt like a damaged one.
"""

import hashlib
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from datasets import DatasetDict, load_from_disk
from omegaconf import OmegaConf

from headcount.config.data import DataConfig
from headcount.errors import ConfigError
from headcount.io import atomic_write_json, writable

log = logging.getLogger(__name__)

# Bump when the processing code changes what a given config produces, so old caches stop matching.
CACHE_FORMAT = 1
CHECKSUMS = "checksums.json"


def cache_root(cfg: DataConfig) -> Path:
    """The absolute cache folder; resolves the schema's ${oc.env:...} default when a DataConfig is built in Python.
    ConfigError for a relative path, or one that is (or is inside) a file."""
    raw = str(OmegaConf.create({"cache_dir": cfg.cache_dir}).cache_dir) if "${" in cfg.cache_dir else cfg.cache_dir
    root = Path(raw).expanduser()
    if not root.is_absolute():
        # A relative path would follow the working directory, which differs between runs and Hydra jobs.
        raise ConfigError("data.cache_dir", cfg.cache_dir, "must be an absolute path (or start with ~)")
    existing = next(folder for folder in (root, *root.parents) if folder.exists())
    if not existing.is_dir():
        where = "is a file" if existing == root else f"is inside a file ({existing})"
        raise ConfigError(*cache_setting(root), f"{where}; the data cache needs a folder")
    return root


def cache_setting(root: Path) -> tuple[str, str]:
    """The setting that chose the cache folder, for messages: HEADCOUNT_CACHE (data.cache_dir's default reads it)
    when it names this folder, else data.cache_dir."""
    env = os.environ.get("HEADCOUNT_CACHE")
    if env and Path(env).expanduser() == root:
        return "HEADCOUNT_CACHE", env
    return "data.cache_dir", str(root)


def require_writable(root: Path, why: str) -> None:
    if not writable(root):
        raise ConfigError(
            *cache_setting(root), f"cannot be written (read-only storage?), and {why}; choose another folder"
        )


def fingerprint(payload: object) -> str:
    blob = json.dumps({"format": CACHE_FORMAT, "payload": payload}, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def load_or_build(root: Path, name: str, build: Callable[[Path], DatasetDict]) -> DatasetDict:
    """Loads <root>/<name>, or builds it first (again, if it is damaged). build(scratch) may leave datasets' own cache
    files in scratch.

    The build is saved into a temporary folder beside the target, given its checksums and renamed into place, so a
    crash leaves no half-written folder that looks complete; when two processes race, the first rename wins and both
    load it.
    """
    target = root / name
    if target.is_dir():
        problem = damage(target)
        if problem is None:
            try:
                splits = load_from_disk(str(target))
                # Written before entries carried checksums, and readable: give it them (where it can be written)
                if not (target / CHECKSUMS).exists() and writable(target):
                    atomic_write_json(target / CHECKSUMS, checksums(target))
                return splits
            except Exception as error:  # Arrow and datasets raise many types for one unreadable file
                problem = f"unreadable: {type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
        require_writable(root, f"its entry {name} for this data is damaged ({problem})")
        log.warning("data cache entry %s is damaged (%s); rebuilding it", target, problem)
        set_aside(target)
    require_writable(root, "it holds no entry for this data yet")
    root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f".{name}.tmp-", dir=root) as work:
        staged = Path(work) / "splits"
        build(Path(work) / "scratch").save_to_disk(str(staged))
        atomic_write_json(staged / CHECKSUMS, checksums(staged))
        try:
            os.replace(staged, target)
        except OSError:
            if not target.is_dir():
                raise
    return load_from_disk(str(target))


def checksums(folder: Path) -> dict[str, str]:
    """Relative path -> sha256 of every file in the folder but the checksums file itself."""
    return {
        path.relative_to(folder).as_posix(): file_sha256(path)
        for path in sorted(folder.rglob("*"))
        if path.is_file() and path.name != CHECKSUMS
    }


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(2**20), b""):
            digest.update(block)
    return digest.hexdigest()


def damage(entry: Path) -> str | None:
    """What is wrong with a cache entry by its checksums (the first file missing or changed), or None. Files the
    entry did not hold when written (datasets' own cache files) are not checked."""
    recorded_path = entry / CHECKSUMS
    if not recorded_path.exists():
        return None
    try:
        recorded = json.loads(recorded_path.read_text())
    except (OSError, ValueError):
        return f"{CHECKSUMS} is unreadable"
    for relative, expected in recorded.items():
        path = entry / relative
        if not path.is_file():
            return f"{relative} is missing"
        if file_sha256(path) != expected:
            return f"{relative} does not match its checksum"
    return None


def set_aside(entry: Path) -> None:
    """Move a damaged entry out of the way (a rename: another process may still read it), then delete it."""
    aside = Path(tempfile.mkdtemp(prefix=f".{entry.name}.damaged-", dir=entry.parent))
    try:
        os.replace(entry, aside / "entry")
    except OSError:
        if entry.is_dir():
            raise
    shutil.rmtree(aside, ignore_errors=True)
