"""Byte-level tokens shared by every text source: documents -> one byte stream -> non-overlapping seq_len chunks."""

import math
from collections.abc import Iterable

import numpy as np

from headcount.config.data import DataConfig
from headcount.errors import ConfigError

SPLITS = ("train", "val", "test")


def split_cap(cfg: DataConfig, split: str) -> int:
    return {"train": cfg.n_train, "val": cfg.n_val, "test": cfg.n_test}[split]


def join_documents(documents: Iterable[bytes], max_bytes: int | None = None) -> bytes:
    """Concatenates documents, stopping once max_bytes are in hand (so a huge stream is never read whole)."""
    parts, total = [], 0
    for document in documents:
        parts.append(document)
        total += len(document)
        if max_bytes is not None and total >= max_bytes:
            break
    return b"".join(parts)


def byte_chunks(data: bytes, seq_len: int) -> np.ndarray:
    """(n_chunks, seq_len) int64 byte values; the tail shorter than seq_len is dropped."""
    n_chunks = len(data) // seq_len
    return np.frombuffer(data, dtype=np.uint8, count=n_chunks * seq_len).reshape(n_chunks, seq_len).astype(np.int64)


def require_every_split(chunks: dict[str, np.ndarray], cfg: DataConfig, key: str, value: object) -> None:
    empty = [split for split in SPLITS if len(chunks[split]) == 0]
    if empty:
        raise ConfigError(
            key, value, f"too little text for one {cfg.seq_len}-byte chunk in every split (empty: {', '.join(empty)})"
        )


def split_by_fraction(chunks: np.ndarray, cfg: DataConfig, key: str, value: object) -> dict[str, np.ndarray]:
    """A seeded permutation of all chunks cut into test/val/train by the fractions (at least one chunk each), then
    capped at n_test/n_val/n_train; key and value name the input in the error when there is too little of it."""
    n = len(chunks)
    n_test, n_val = math.ceil(cfg.test_fraction * n), math.ceil(cfg.val_fraction * n)
    order = np.random.default_rng(cfg.seed).permutation(n)
    bounds = {"test": (0, n_test), "val": (n_test, n_test + n_val), "train": (n_test + n_val, n)}
    splits = {split: chunks[order[start:end][: split_cap(cfg, split)]] for split, (start, end) in bounds.items()}
    require_every_split(splits, cfg, key, value)
    return splits


def chunks_needed(cfg: DataConfig) -> int:
    """How many chunks split_by_fraction needs so that no split is short of its cap (bounds what a stream reads)."""
    train_share = 1 - cfg.val_fraction - cfg.test_fraction
    return max(
        math.ceil((cfg.n_train + 2) / train_share),  # +2: the val and test counts are rounded up
        math.ceil(cfg.n_val / cfg.val_fraction),
        math.ceil(cfg.n_test / cfg.test_fraction),
    )
