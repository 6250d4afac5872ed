"""The LightningDataModule: build_splits' splits as batches {"input_ids": (B, T) int64, "loss_mask": (B, T) bool}."""

import lightning as L
from datasets import Dataset
from torch.utils.data import DataLoader

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
        return DataLoader(self.splits["val"], batch_size=self.cfg.batch_size, **self._workers())

    def test_dataloader(self) -> DataLoader:
        return DataLoader(self.splits["test"], batch_size=self.cfg.batch_size, **self._workers())
