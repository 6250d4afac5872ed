"""The examples ablations see: the first `n` examples of a split, as batches on the evaluation device."""

import torch
from torch import Tensor

from headcount.errors import ConfigError


def split_examples(splits: dict, split: str, n: int | None, key: str) -> dict[str, Tensor]:
    """input_ids (N, T) int64 and loss_mask (N, T) bool of the first n examples (all when n is None)."""
    if split not in splits:
        raise ConfigError(key, split, f"allowed: {', '.join(splits)}")
    dataset = splits[split].with_format("torch")
    n = len(dataset) if n is None else min(n, len(dataset))
    if n == 0:
        raise ConfigError(key, split, "has no examples")
    rows = dataset[:n]
    return {"input_ids": rows["input_ids"].long(), "loss_mask": rows["loss_mask"].bool()}


def to_batches(examples: dict[str, Tensor], batch_size: int, device: torch.device) -> list[dict[str, Tensor]]:
    n = len(examples["input_ids"])
    return [
        {key: value[i : i + batch_size].to(device) for key, value in examples.items()} for i in range(0, n, batch_size)
    ]
