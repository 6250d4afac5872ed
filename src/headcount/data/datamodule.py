"""The LightningDataModule: build_splits' splits as batches {"input_ids": (B, T) int64, "loss_mask": (B, T) bool}.

Under DDP the validation and test splits are shared out whole: Lightning's distributed sampler would repeat a split's
first examples to give every process as many, and they would count twice in the split's numbers. Here each process
gets the same number of batches (DDP syncs its buffers at every forward pass of a validation during fit, so a process
with a batch fewer would leave the others waiting), the split padded with examples that mark no target: they add 0 to
the sums of losses and targets (metrics.py), so the numbers are the whole split's, each example once."""

import lightning as L
import torch
from datasets import Dataset
from torch.utils.data import DataLoader, DistributedSampler
from torch.utils.data import Dataset as TorchDataset

from headcount.config.data import TEXT_SOURCES, DataConfig, data_vocab_size
from headcount.data.resumable import resumable_loader
from headcount.data.splits import build_splits, validate_data_config
from headcount.data.tokens import TextTokenizer
from headcount.errors import ConfigError


class HeadcountDataModule(L.LightningDataModule):
    def __init__(self, cfg: DataConfig, tokenizer: TextTokenizer | None = None):
        super().__init__()
        validate_data_config(cfg)
        self.cfg, self.tokenizer = cfg, tokenizer
        self.vocab_size = data_vocab_size(cfg) or (tokenizer.vocab_size if tokenizer is not None else None)
        self._splits: dict[str, Dataset] | None = None

    def prepare_data(self) -> None:
        # Lightning calls this on one process per node: the text cache is written once, then every rank loads it.
        if self.cfg.source in TEXT_SOURCES:
            build_splits(self.cfg, self.tokenizer)

    def setup(self, stage: str | None = None) -> None:
        if self._splits is not None:
            return
        splits = build_splits(self.cfg, self.tokenizer)
        if len(splits["train"]) < self.cfg.batch_size:
            # drop_last would leave no training batch at all.
            raise ConfigError(
                "data.batch_size", self.cfg.batch_size, f"must be at most the {len(splits['train'])} training examples"
            )
        self._splits = splits

    @property
    def splits(self) -> dict[str, Dataset]:
        if self._splits is None:
            raise RuntimeError("HeadcountDataModule.setup() has not run yet")
        return self._splits

    def _workers(self) -> dict:
        return dict(num_workers=self.cfg.num_workers, persistent_workers=self.cfg.num_workers > 0)

    def train_dataloader(self) -> DataLoader:
        # Resumable mid-epoch (data/resumable.py), with a fresh generator: the same seed replays the same batches.
        return resumable_loader(self.splits["train"], self.cfg.batch_size, self.cfg.seed, **self._workers())

    def val_dataloader(self) -> DataLoader:
        return self._evaluation_loader(self.splits["val"])

    def test_dataloader(self) -> DataLoader:
        return self._evaluation_loader(self.splits["test"])

    def _evaluation_loader(self, split: Dataset) -> DataLoader:
        world = self.trainer.world_size if self.trainer is not None else 1
        if world == 1:
            return DataLoader(split, batch_size=self.cfg.batch_size, **self._workers())
        padded = PaddedSplit(split, -(-len(split) // world) * world)
        # A DistributedSampler of its own, which Lightning keeps; the padded length divides evenly, so it adds nothing
        sampler = DistributedSampler(padded, num_replicas=world, rank=self.trainer.global_rank, shuffle=False)
        return DataLoader(padded, batch_size=self.cfg.batch_size, sampler=sampler, **self._workers())


class PaddedSplit(TorchDataset):
    """A split made `length` long by copies of its first example that mark no target (loss_mask all False)."""

    def __init__(self, split: Dataset, length: int):
        self.split, self.length = split, length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> dict:
        if index < len(self.split):
            return self.split[index]
        example = dict(self.split[0])
        example["loss_mask"] = torch.zeros_like(torch.as_tensor(example["loss_mask"]))
        return example
