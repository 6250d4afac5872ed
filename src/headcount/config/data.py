"""The data section of every config: which source, how long the sequences, how many examples."""

from dataclasses import dataclass

SYNTHETIC_SOURCES = ("induction", "assoc_recall", "offset_diff", "copy")
TEXT_SOURCES = ("text", "pystdlib", "hub")
SOURCES = SYNTHETIC_SOURCES + TEXT_SOURCES


@dataclass
class DataConfig:
    source: str = "induction"
    seq_len: int = 64
    # Synthetic tasks: the token alphabet. Text sources are byte-level and always use 256.
    vocab_size: int = 32
    seed: int = 0
    n_train: int = 4096  # synthetic: examples per split; text: at most this many chunks
    n_val: int = 512
    n_test: int = 512
    batch_size: int = 32
    num_workers: int = 0
    # assoc_recall: key-value pairs per sequence
    n_pairs: int = 8
    # offset_diff: token t predicts (x[t - offset_a] - x[t - offset_b]) mod vocab_size
    offset_a: int = 1
    offset_b: int = 3
    # text: a file or a folder of .txt files; pystdlib ignores it
    path: str | None = None
    # text and pystdlib: share of files (pystdlib) or of chunks (text) held out for val and test
    val_fraction: float = 0.05
    test_fraction: float = 0.05
    # hub: a Hugging Face dataset by name (needs network once; cached after)
    hub_name: str | None = None
    hub_config: str | None = None
    text_field: str = "text"
    # Where processed data is cached; absolute, independent of Hydra's run directory.
    cache_dir: str = "${oc.env:HEADCOUNT_CACHE,${oc.env:HOME,/tmp}/.cache/headcount}"
