"""What a run's data is, by content: a hash of each split's tokens and targets, so that a later stage can tell whether
it sees the data the run was trained on. Hashing the arrays (not the config, not the files they came from) means a
text file edited in place is caught, and a cache folder or data file moved elsewhere is not mistaken for a change."""

import hashlib

import numpy as np
from datasets import Dataset


def split_fingerprint(split: Dataset) -> dict:
    """{"examples": n, "sha256": hash of input_ids (int64) and loss_mask (bool) as (n, seq_len) arrays}."""
    columns = split.with_format("numpy")[:]
    digest = hashlib.sha256()
    more = [
        (name, np.bool_ if name.endswith("mask") else np.int64) for name in ("src_ids", "src_mask") if name in columns
    ]
    for name, dtype in (("input_ids", np.int64), ("loss_mask", np.bool_), *more):  # a seq2seq task's source too
        array = np.ascontiguousarray(columns[name], dtype=dtype)
        digest.update(f"{name}:{array.shape}".encode())
        digest.update(array.tobytes())
    return {"examples": len(split), "sha256": digest.hexdigest()[:16]}


def data_fingerprint(splits: dict[str, Dataset]) -> dict[str, dict]:
    """split -> split_fingerprint, for every split."""
    return {name: split_fingerprint(split) for name, split in splits.items()}


def changed_splits(recorded: dict[str, dict], current: dict[str, dict]) -> list[str]:
    """The splits whose content differs between two data fingerprints (a split only one of them has counts too)."""
    return [name for name in sorted(set(recorded) | set(current)) if recorded.get(name) != current.get(name)]
