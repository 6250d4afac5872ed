"""The LightningDataModule: build_splits' splits as batches {"input_ids": (B, T) int64, "loss_mask": (B, T) bool}."""

import lightning as L
import torch
from datasets import Dataset
from torch.utils.data import DataLoader

from headcount.config.data import TEXT_SOURCES, DataConfig, data_vocab_size
from headcount.data.splits import build_splits, validate_data_config
from headcount.errors import ConfigError


class HeadcountDataModule(L.LightningDataModule):
    def __init__(self, cfg: DataConfig):
        super().__init__()
        validate_data_config(cfg)
        self.cfg = cfg
        self.vocab_size = data_vocab_size(cfg)
        self._splits: dict[str, Dataset] | None = None

    def prepare_data(self) -> None:
        # Lightning calls this on one process per node: the text cache is written once, then every rank loads it.
        if self.cfg.source in TEXT_SOURCES:
            build_splits(self.cfg)

    def setup(self, stage: str | None = None) -> None:
        if self._splits is not None:
            return
        splits = build_splits(self.cfg)
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

    def _loader(self, split: str, train: bool) -> DataLoader:
        return DataLoader(
            self.splits[split],
            batch_size=self.cfg.batch_size,
            shuffle=train,
            drop_last=train,
            # A fresh generator per loader: the same seed replays the same batches, run after run.
            generator=torch.Generator().manual_seed(self.cfg.seed) if train else None,
            num_workers=self.cfg.num_workers,
            persistent_workers=self.cfg.num_workers > 0,
        )

    def train_dataloader(self) -> DataLoader:
        return self._loader("train", train=True)

    def val_dataloader(self) -> DataLoader:
        return self._loader("val", train=False)

    def test_dataloader(self) -> DataLoader:
        return self._loader("test", train=False)
