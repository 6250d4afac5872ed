"""The one example format every source produces: `input_ids` (int64) and `loss_mask` (bool), both seq_len long; and
the one place examples are split into batches (`to_batches`), which every reader of them shares."""

import collections.abc

import numpy as np
import pyarrow as pa
import torch
from datasets import Dataset, Features, Sequence, Value
from torch import Tensor

from headcount.errors import ConfigError


def examples_dataset(input_ids: np.ndarray, loss_mask: np.ndarray, **more: np.ndarray) -> Dataset:
    """(n, seq_len) arrays -> a Dataset of fixed-length rows; loss_mask[:, t] marks input_ids[:, t] as a target.
    more: further (n, width) int64 or bool columns (a sequence-to-sequence task's src_ids and src_mask)."""
    arrays = {"input_ids": input_ids, "loss_mask": loss_mask, **more}
    kinds = {name: "bool" if array.dtype == bool else "int64" for name, array in arrays.items()}
    features = Features({name: Sequence(Value(kinds[name]), length=a.shape[1]) for name, a in arrays.items()})
    # Arrow fixed-size lists straight from the flat buffers: ~15x faster than letting datasets walk Python lists.
    columns = {
        name: pa.FixedSizeListArray.from_arrays(
            np.ascontiguousarray(a, bool if kinds[name] == "bool" else np.int64).reshape(-1), a.shape[1]
        )
        for name, a in arrays.items()
    }
    return Dataset.from_dict(columns, features=features)


def language_model_mask(n: int, seq_len: int) -> np.ndarray:
    """Plain language modelling: every token is a target except the first, which has nothing before it."""
    mask = np.ones((n, seq_len), dtype=bool)
    mask[:, 0] = False
    return mask


def split_examples(splits: dict, split: str, n: int | None, key: str) -> dict[str, Tensor]:
    """input_ids (N, T) int64 and loss_mask (N, T) bool of the first n examples (all when n is None), and a
    sequence-to-sequence split's source, src_ids (N, S) int64 and src_mask (N, S) bool."""
    if split not in splits:
        raise ConfigError(key, split, f"allowed: {', '.join(splits)}")
    dataset = splits[split].with_format("torch")
    n = len(dataset) if n is None else min(n, len(dataset))
    if n == 0:
        raise ConfigError(key, split, "has no examples")
    rows = dataset[:n]
    source = {"src_ids": rows["src_ids"].long(), "src_mask": rows["src_mask"].bool()} if "src_ids" in rows else {}
    return {"input_ids": rows["input_ids"].long(), "loss_mask": rows["loss_mask"].bool(), **source}


class ExampleBatches(collections.abc.Sequence):
    """Examples split into batches once, where they enter: `examples` holds every example's tensors (N, ...) on the
    device, and each batch is a view of batch_size of their rows (no copy). A reader that takes them whole (the
    circuits core, through ablation/scans/circuit_inputs.py) reads `examples`, never the batches joined again."""

    def __init__(self, examples: dict[str, Tensor], batch_size: int):
        self.examples, self.batch_size = examples, batch_size
        n = len(examples["input_ids"])
        self.views = [
            {key: value[i : i + batch_size] for key, value in examples.items()} for i in range(0, n, batch_size)
        ]

    def __getitem__(self, index):  # a batch, or a list of them for a slice
        return self.views[index]

    def __len__(self) -> int:
        return len(self.views)


def to_batches(examples: dict[str, Tensor], batch_size: int, device: torch.device) -> ExampleBatches:
    """The examples on `device`, in batches of batch_size (the last may hold fewer)."""
    return ExampleBatches({key: value.to(device) for key, value in examples.items()}, batch_size)
