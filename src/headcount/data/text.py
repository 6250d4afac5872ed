"""Real text as examples: a local file or folder (text), this Python's standard library (pystdlib), or a Hugging Face
Hub dataset (hub). Each is read through `datasets`, tokenized (bytes, or a pretrained tokenizer: data/tokens.py),
chunked and cached under a key that includes the tokenizer."""

import hashlib
import sys
import sysconfig
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
from datasets import Dataset, DatasetDict, Features, Value, load_dataset

from headcount.config.data import DataConfig
from headcount.data.cache import cache_root, fingerprint, load_or_build
from headcount.data.chunking import SPLITS, chunks_needed, require_every_split, split_by_fraction, split_cap
from headcount.data.examples import examples_dataset, language_model_mask
from headcount.data.sources import DATA_SOURCES, TextSource
from headcount.data.tokens import TextTokenizer, cache_fields, token_chunks
from headcount.errors import ConfigError
from headcount.hub import offline_without_network

# pystdlib leaves out third-party code and the test suites (huge and repetitive: they would swamp the library itself).
STDLIB_EXCLUDED_DIRS = frozenset({"site-packages", "test", "tests", "idlelib"})


def _read_files(paths: list[str]) -> Iterator[dict]:
    for path in paths:
        yield {"bytes": Path(path).read_bytes()}


def _load_documents(paths: list[Path], scratch: Path) -> Dataset:
    """Raw file bytes, one row per file: the exact bytes, with no newline translation or decoding on the way."""
    return Dataset.from_generator(
        _read_files,
        features=Features({"bytes": Value("binary")}),
        gen_kwargs={"paths": [str(path) for path in paths]},
        cache_dir=str(scratch),
    )


def _to_dataset_dict(chunks: dict[str, np.ndarray], cfg: DataConfig) -> DatasetDict:
    return DatasetDict(
        {split: examples_dataset(ids, language_model_mask(len(ids), cfg.seq_len)) for split, ids in chunks.items()}
    )


def config_fields(cfg: DataConfig) -> dict:
    """The fields that shape every text source's splits (source-specific inputs are added by each source)."""
    fields = ("source", "seq_len", "seed", "n_train", "n_val", "n_test", "val_fraction", "test_fraction")
    return {field: getattr(cfg, field) for field in fields}


def text_files(cfg: DataConfig) -> list[Path]:
    """cfg.path (not None: validated first) itself, or every *.txt below it, sorted; ConfigError if nothing to read."""
    root = Path(cfg.path).expanduser()
    if root.is_file():
        files = [root]
    elif root.is_dir():
        files = sorted(path for path in root.rglob("*.txt") if path.is_file())
        if not files:
            raise ConfigError("data.path", cfg.path, "no .txt files in this folder")
    else:
        raise ConfigError("data.path", cfg.path, "no such file or folder")
    if all(path.stat().st_size == 0 for path in files):
        raise ConfigError("data.path", cfg.path, "the text is empty")
    return files


def text_splits(cfg: DataConfig, tokenizer: TextTokenizer | None = None) -> DatasetDict:
    files = text_files(cfg)
    root = Path(cfg.path).expanduser()
    identity = [(path.relative_to(root).as_posix(), hashlib.sha256(path.read_bytes()).hexdigest()) for path in files]
    name = f"text-{fingerprint({**config_fields(cfg), 'files': identity, **cache_fields(tokenizer)})}"
    return load_or_build(cache_root(cfg), name, chunked_splits(files, cfg, tokenizer, "data.path", cfg.path))


def chunked_splits(
    files: list[Path], cfg: DataConfig, tokenizer: TextTokenizer | None, key: str, value: object
) -> Callable[[Path], DatasetDict]:
    """What builds the splits of these files' chunks, split by fraction (key and value name the input when there is
    too little of it)."""

    def build(scratch: Path) -> DatasetDict:
        chunks = token_chunks(_load_documents(files, scratch)["bytes"], cfg.seq_len, tokenizer)
        return _to_dataset_dict(split_by_fraction(chunks, cfg, key, value), cfg)

    return build


def stdlib_files() -> tuple[Path, list[str]]:
    """The stdlib folder and its *.py files (relative, POSIX, sorted) minus STDLIB_EXCLUDED_DIRS."""
    root = Path(sysconfig.get_paths()["stdlib"])
    relative = (path.relative_to(root) for path in root.rglob("*.py") if path.is_file())
    return root, sorted(path.as_posix() for path in relative if not STDLIB_EXCLUDED_DIRS & set(path.parts[:-1]))


def stdlib_split_of(relative_path: str, cfg: DataConfig) -> str:
    """A file's split from a stable hash of its path (Python's hash() is salted per process), so it never moves."""
    unit = int.from_bytes(hashlib.sha1(relative_path.encode()).digest()[:8], "big") / 2**64
    if unit < cfg.test_fraction:
        return "test"
    return "val" if unit < cfg.test_fraction + cfg.val_fraction else "train"


def pystdlib_splits(cfg: DataConfig, tokenizer: TextTokenizer | None = None) -> DatasetDict:
    root, files = stdlib_files()
    identity = [(path, (root / path).stat().st_size) for path in files]
    fields = {**config_fields(cfg), "python": sys.version, "files": identity, **cache_fields(tokenizer)}
    name = f"pystdlib-{fingerprint(fields)}"

    def build(scratch: Path) -> DatasetDict:
        documents = _load_documents([root / path for path in files], scratch)
        by_split: dict[str, list[bytes]] = {split: [] for split in SPLITS}
        for path, content in zip(files, documents["bytes"]):
            by_split[stdlib_split_of(path, cfg)].append(content)
        chunks = {}
        for index, split in enumerate(SPLITS):
            all_chunks = token_chunks(by_split[split], cfg.seq_len, tokenizer)
            # A seeded order before the cap, so a capped split samples chunks from all of its files.
            order = np.random.default_rng((cfg.seed, index)).permutation(len(all_chunks))
            chunks[split] = all_chunks[order[: split_cap(cfg, split)]]
        require_every_split(chunks, cfg, "data.seq_len", cfg.seq_len)
        return _to_dataset_dict(chunks, cfg)

    return load_or_build(cache_root(cfg), name, build)


def hub_splits(cfg: DataConfig, tokenizer: TextTokenizer | None = None) -> DatasetDict:
    """The Hub dataset's train split, streamed only as far as the capped splits need, then split like text."""
    fields = {**config_fields(cfg), "hub": [cfg.hub_name, cfg.hub_config, cfg.text_field], **cache_fields(tokenizer)}
    name = f"hub-{fingerprint(fields)}"

    def documents() -> Iterator[bytes]:
        from datasets import config

        if not config.HF_HUB_OFFLINE:  # no network: fail at once, not after half a minute of retries
            offline_without_network()
        with hub_errors(cfg):
            for row in load_dataset(cfg.hub_name, cfg.hub_config, split="train", streaming=True):
                if cfg.text_field not in row:
                    columns = ", ".join(row)
                    raise ConfigError("data.text_field", cfg.text_field, f"columns of {cfg.hub_name}: {columns}")
                yield (row[cfg.text_field] or "").encode("utf-8")

    def build(scratch: Path) -> DatasetDict:
        chunks = token_chunks(documents(), cfg.seq_len, tokenizer, max_chunks=chunks_needed(cfg))
        return _to_dataset_dict(split_by_fraction(chunks, cfg, "data.hub_name", cfg.hub_name), cfg)

    return load_or_build(cache_root(cfg), name, build)


@contextmanager
def hub_errors(cfg: DataConfig) -> Iterator[None]:
    """What datasets raises when it cannot stream a Hub dataset, as one line naming data.hub_name. Only a dataset
    missing from headcount's cache is streamed, so a machine without a network gets here."""
    from datasets import config
    from datasets.exceptions import DatasetNotFoundError

    try:
        yield
    except DatasetNotFoundError as error:  # (a FileNotFoundError: before the OSErrors)
        raise ConfigError("data.hub_name", cfg.hub_name, f"the Hub has no such dataset ({first_line(error)})") from None
    except ConnectionError as error:
        why = "no network, or HF_HUB_OFFLINE or HF_DATASETS_OFFLINE set" if config.HF_HUB_OFFLINE else first_line(error)
        raise ConfigError(
            "data.hub_name",
            cfg.hub_name,
            f"not in the local cache ({cache_root(cfg)}) and this machine is offline ({why}); run once with a "
            "network to cache it",
        ) from None


def first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


DATA_SOURCES.register(
    TextSource("text", text_splits, "your .txt files (data.path): byte-level or a checkpoint's tokenizer")
)
DATA_SOURCES.register(
    TextSource("pystdlib", pystdlib_splits, "the running Python's standard library source, no download")
)
DATA_SOURCES.register(
    TextSource("hub", hub_splits, "a Hugging Face dataset by name (data.hub_name); needs the network once")
)
