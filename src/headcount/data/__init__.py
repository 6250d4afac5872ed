"""Data for headcount: synthetic attention tasks and byte-level text, as train/val/test splits and a DataModule."""

from headcount.config.data import SOURCES, DataConfig, data_vocab_size
from headcount.data.datamodule import HeadcountDataModule
from headcount.data.splits import build_splits, validate_data_config
from headcount.data.synthetic import induction_first_part_mask

__all__ = [
    "SOURCES",
    "DataConfig",
    "HeadcountDataModule",
    "build_splits",
    "data_vocab_size",
    "induction_first_part_mask",
    "validate_data_config",
]
