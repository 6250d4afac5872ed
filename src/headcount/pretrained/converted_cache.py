"""Converted pretrained weights kept on disk, so that a GGUF file is de-quantised and converted once.

An entry is a folder <cache>/pretrained/converted/<sha256 of the GGUF file>-v<FORMAT> (cache: $HEADCOUNT_CACHE, else
~/.cache/headcount) holding the converted model's float32 tensors (`model.safetensors`, headcount's names; a tied
unembedding stored once), its tokenizer as transformers saves it, and `entry.json`: the ModelConfig, what provenance
records of the transformers config, and the sha256 of every file. The entry is checked against those sums before it
is read: a damaged one (a disk error, a copy cut short, a file edited by hand) is rebuilt with a one-line notice.

The first load converts under a file lock (<entry>.lock), writes the entry into a temporary folder beside it
(`.<entry>.tmp-*`) and renames it into place, so two processes loading the same file at once convert it once, and
neither can read half an entry. Where the cache cannot be written, the model is converted every time (with a notice)
and nothing is kept; so too where the storage refuses the entry while it is written (disk full): the converted model
is used, the half-written folder removed, with one notice.

A process killed while it writes leaves its temporary folder (as large as the weights). Every load removes such
folders whose entry's lock no process holds, with a notice: a writer holds its entry's lock for as long as its
temporary folder exists, so a folder with a free lock belongs to no live process.
"""

import hashlib
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from headcount.config import plain, typed
from headcount.config.model import ModelConfig
from headcount.io import MACHINE_ERRNOS, machine_fault, writable
from headcount.model.transformer import Transformer

log = logging.getLogger(__name__)

FORMAT = 1  # bump when conversion changes what a given file gives, so that older entries stop matching
WEIGHTS, TOKENIZER, RECORD = "model.safetensors", "tokenizer", "entry.json"


@dataclass
class Converted:
    model: Transformer
    tokenizer: Any
    hf_record: dict  # model_type and architectures of the transformers config, as provenance records them


def cache_root() -> Path:
    base = os.environ.get("HEADCOUNT_CACHE") or Path.home() / ".cache" / "headcount"
    return Path(base).expanduser() / "pretrained" / "converted"


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(2**24):
            digest.update(chunk)
    return digest.hexdigest()


@lru_cache(maxsize=16)
def _unchanged_sha256(path: str, size: int, mtime_ns: int) -> str:
    return sha256(Path(path))


def file_sha256(path: Path) -> str:
    """A file's sha256, read once per process while the file is unchanged (its size and modification time)."""
    stat = Path(path).stat()
    return _unchanged_sha256(str(Path(path).resolve()), stat.st_size, stat.st_mtime_ns)


def entry_folder(key: str) -> Path:
    return cache_root() / f"{key}-v{FORMAT}"


def cached_config(key: str) -> ModelConfig | None:
    """The ModelConfig an intact-looking entry records (its record only: the weights are checked when read), or
    None."""
    try:
        record = json.loads((entry_folder(key) / RECORD).read_text())
        return typed(record["model_config"], ModelConfig)
    except (OSError, ValueError, KeyError, TypeError):
        return None


def cached_tokenizer(key: str) -> Any | None:
    """The tokenizer an entry holds, or None without an entry (or one whose tokenizer does not read)."""
    folder = entry_folder(key) / TOKENIZER
    if not (entry_folder(key) / RECORD).is_file():
        return None
    try:
        import transformers

        return transformers.AutoTokenizer.from_pretrained(str(folder))
    except (OSError, ValueError, TypeError):
        return None


def load_or_convert(key: str, source: str, convert: Callable[[], Converted]) -> Converted:
    """The converted model of the file whose sha256 is key: read from its entry, else made by convert() and kept."""
    entry = entry_folder(key)
    root = entry.parent
    if root.is_dir() and writable(root):
        remove_left_behind(root)
    converted, damage = read_entry(entry)
    if converted is not None:
        return converted
    if not writable(root):
        log.warning("the converted-weights cache %s cannot be written: converting %s without keeping it", root, source)
        return convert()
    root.mkdir(parents=True, exist_ok=True)
    from filelock import FileLock

    with FileLock(str(entry) + ".lock"):
        converted, damage = read_entry(entry)  # another process may have written it while this one waited
        if converted is not None:
            return converted
        if damage:
            log.warning("converted weights of %s in %s are damaged (%s): converting again", source, entry, damage)
            shutil.rmtree(entry, ignore_errors=True)
        converted = convert()
        try:
            write_entry(entry, converted)
        except Exception as error:
            if (why := storage_refusal(error)) is None:
                raise
            log.warning(
                "the converted-weights cache %s refused the entry of %s (%s): using the converted model without "
                "keeping it (it is converted again next time; free space to keep it)",
                root,
                source,
                why,
            )
    return converted


TEMPORARY = ".tmp-"  # an entry's temporary folder: .<entry name>.tmp-<random>


def remove_left_behind(root: Path) -> None:
    """Remove the temporary folders of entries that no process is writing: those whose entry's lock is free (a
    writer holds it for as long as its folder exists, and a killed writer's lock is released with it), with a
    notice each. A lock held by this process counts as held (flock: a second descriptor does not get it)."""
    from filelock import FileLock, Timeout

    for folder in sorted(root.glob(f".*{TEMPORARY}*")):
        entry = root / folder.name[1:].rsplit(TEMPORARY, 1)[0]
        try:
            with FileLock(str(entry) + ".lock", timeout=0):
                if not folder.exists():  # its writer finished between the listing and the lock
                    continue
                size = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())
                shutil.rmtree(folder, ignore_errors=True)
        except Timeout:
            continue  # a live process is writing it
        log.warning(
            "removed %s (%.0f MB): a converted-weights entry left half-written by a process that stopped while "
            "writing it",
            folder,
            size / 2**20,
        )


def storage_refusal(error: BaseException) -> str | None:
    """Why the storage refused a write (disk full, quota, read-only, an I/O error), from an OSError in the error's
    chain or safetensors' own error, which carries only the message of the system's (`... No space left on device
    (os error 28)`); None for any other error."""
    if (fault := machine_fault(error)) is not None:
        return fault.strerror or str(fault)
    if type(error).__name__ == "SafetensorError":
        for code in sorted(MACHINE_ERRNOS):
            if os.strerror(code) in str(error):
                return os.strerror(code)
    return None


def read_entry(entry: Path) -> tuple[Converted | None, str | None]:
    """(the entry's model, None), or (None, why it cannot be used) for a damaged entry, or (None, None) for none."""
    if not entry.exists():
        return None, None
    try:
        record = json.loads((entry / RECORD).read_text())
        for name, expected in record["sha256"].items():
            if file_sha256(entry / name) != expected:
                return None, f"{name} is not the file written there"
        cfg = typed(record["model_config"], ModelConfig)
        import transformers
        from safetensors.torch import load_file

        from headcount.pretrained.convert import model_from_state

        # The tokenizer first: what it needs only while it loads is then not added to the weights' memory.
        tokenizer = transformers.AutoTokenizer.from_pretrained(str(entry / TOKENIZER))
        # pread: each tensor read into memory of its own, not through a mapping of the whole file
        model = model_from_state(cfg, load_file(entry / WEIGHTS, backend="pread"))
    except Exception as err:  # any unreadable part: a missing file, bad JSON, a safetensors or tokenizer error
        return None, f"{type(err).__name__}: {str(err).strip().splitlines()[0] if str(err).strip() else ''}"
    return Converted(model, tokenizer, record["hf"]), None


def write_entry(entry: Path, converted: Converted) -> None:
    """The entry written into a temporary folder beside it, then renamed into place."""
    from safetensors.torch import save_file

    model = converted.model
    state = {k: v for k, v in model.state_dict().items() if not (model.cfg.tie_embeddings and k == "lm_head.weight")}
    with tempfile.TemporaryDirectory(prefix=f".{entry.name}{TEMPORARY}", dir=entry.parent) as work:
        staged = Path(work) / "entry"
        staged.mkdir()
        save_file({k: v.contiguous() for k, v in state.items()}, staged / WEIGHTS)
        converted.tokenizer.save_pretrained(str(staged / TOKENIZER))
        files = [staged / WEIGHTS, *sorted((staged / TOKENIZER).iterdir())]
        sums = {str(p.relative_to(staged)): sha256(p) for p in files}
        record = {"format": FORMAT, "model_config": plain(model.cfg), "hf": converted.hf_record, "sha256": sums}
        (staged / RECORD).write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
        os.replace(staged, entry)
