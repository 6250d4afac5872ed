"""The data layer's entry points: check a DataConfig and build its train/val/test splits."""

from datasets import Dataset

import headcount.data.essays  # noqa: F401  (registers the essays source)
import headcount.data.text  # noqa: F401  (registers the text sources)
import headcount.data.translation  # noqa: F401  (registers the translation task)
from headcount.config.data import SYNTHETIC_SOURCES, DataConfig, validate_data_section
from headcount.data.cache import cache_root
from headcount.data.chunking import SPLITS, split_cap
from headcount.data.examples import examples_dataset
from headcount.data.sources import DATA_SOURCES
from headcount.data.synthetic import check_synthetic, synthetic_arrays
from headcount.data.tokens import TextTokenizer


def validate_data_config(cfg: DataConfig) -> None:
    """Every check that needs no data: the section's own, the synthetic task's, and the cache folder's."""
    validate_data_section(cfg)
    if cfg.source in SYNTHETIC_SOURCES:
        check_synthetic(cfg)
    else:
        cache_root(cfg)  # raises on a relative cache_dir before any file is read


def build_splits(cfg: DataConfig, tokenizer: TextTokenizer | None = None) -> dict[str, Dataset]:
    """{"train", "val", "test"} -> torch-formatted Datasets with columns input_ids (int64) and loss_mask (bool).
    tokenizer: how a text source is tokenized (None: bytes); synthetic sources ignore it."""
    validate_data_config(cfg)
    if cfg.source in SYNTHETIC_SOURCES:
        # A task's arrays: (input_ids, loss_mask), or a dict of named columns (a sequence-to-sequence task's)
        arrays = {split: synthetic_arrays(cfg, index, split_cap(cfg, split)) for index, split in enumerate(SPLITS)}
        splits = {
            split: examples_dataset(**columns) if isinstance(columns, dict) else examples_dataset(*columns)
            for split, columns in arrays.items()
        }
    else:
        if cfg.tokenizer == "pretrained" and tokenizer is None:
            raise ValueError("data.tokenizer=pretrained: build_splits needs the tokenizer (headcount.pretrained)")
        splits = DATA_SOURCES[cfg.source].build(cfg, tokenizer)
    return {split: splits[split].with_format("torch") for split in SPLITS}
