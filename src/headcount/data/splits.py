"""The data layer's entry points: check a DataConfig, tell its vocabulary, build its train/val/test splits."""

from datasets import Dataset

from headcount.config.data import SOURCES, SYNTHETIC_SOURCES, DataConfig
from headcount.data.cache import cache_root
from headcount.data.chunking import BYTE_VOCAB, SPLITS, split_cap
from headcount.data.examples import examples_dataset
from headcount.data.synthetic import check_synthetic, synthetic_arrays
from headcount.data.text import hub_splits, pystdlib_splits, text_splits
from headcount.errors import ConfigError

TEXT_BUILDERS = {"text": text_splits, "pystdlib": pystdlib_splits, "hub": hub_splits}


def _check_source(cfg: DataConfig) -> None:
    if cfg.source not in SOURCES:
        raise ConfigError("data.source", cfg.source, f"allowed: {', '.join(SOURCES)}")


def validate_data_config(cfg: DataConfig) -> None:
    """Every check that needs no data; raises ConfigError naming the first bad key."""
    _check_source(cfg)
    for key, value, minimum in (
        ("seq_len", cfg.seq_len, 2),
        ("n_train", cfg.n_train, 1),
        ("n_val", cfg.n_val, 1),
        ("n_test", cfg.n_test, 1),
        ("batch_size", cfg.batch_size, 1),
        ("num_workers", cfg.num_workers, 0),
        ("seed", cfg.seed, 0),  # numpy seeds must be non-negative
    ):
        if value < minimum:
            raise ConfigError(f"data.{key}", value, f"must be an integer >= {minimum}")
    if cfg.source in SYNTHETIC_SOURCES:
        if cfg.batch_size > cfg.n_train:
            raise ConfigError("data.batch_size", cfg.batch_size, f"must be at most data.n_train={cfg.n_train}")
        check_synthetic(cfg)
        return
    for key, value in (("val_fraction", cfg.val_fraction), ("test_fraction", cfg.test_fraction)):
        if not 0 < value < 1:
            raise ConfigError(f"data.{key}", value, "must be strictly between 0 and 1")
    if cfg.val_fraction + cfg.test_fraction >= 1:
        raise ConfigError("data.test_fraction", cfg.test_fraction, "val_fraction + test_fraction must be below 1")
    cache_root(cfg)  # raises on a relative cache_dir before any file is read
    if cfg.source == "hub" and cfg.hub_name is None:
        raise ConfigError("data.hub_name", None, "source hub needs a Hugging Face dataset name")
    if cfg.source == "text" and cfg.path is None:
        raise ConfigError("data.path", None, "source text needs a file or a folder of .txt files")


def data_vocab_size(cfg: DataConfig) -> int:
    """Token ids lie in [0, this): the task alphabet for synthetic sources, bytes for text sources."""
    _check_source(cfg)
    return cfg.vocab_size if cfg.source in SYNTHETIC_SOURCES else BYTE_VOCAB


def build_splits(cfg: DataConfig) -> dict[str, Dataset]:
    """{"train", "val", "test"} -> torch-formatted Datasets with columns input_ids (int64) and loss_mask (bool)."""
    validate_data_config(cfg)
    if cfg.source in SYNTHETIC_SOURCES:
        splits = {
            split: examples_dataset(*synthetic_arrays(cfg, index, split_cap(cfg, split)))
            for index, split in enumerate(SPLITS)
        }
    else:
        splits = TEXT_BUILDERS[cfg.source](cfg)
    return {split: splits[split].with_format("torch") for split in SPLITS}
