"""The data section of every config: which source, how long the sequences, how many examples.

The defaults are the default data, `data=induction`; each conf/data/<source>.yaml holds what its source changes.
"""

from dataclasses import dataclass

from headcount.config.choice import Choice, check_bools, check_choice
from headcount.errors import ConfigError, check_seed


class Source(Choice):
    induction = "induction"
    assoc_recall = "assoc_recall"
    offset_diff = "offset_diff"
    copy = "copy"
    translation = "translation"
    translation_seq2seq = "translation_seq2seq"
    text = "text"
    pystdlib = "pystdlib"
    essays = "essays"
    hub = "hub"


class Tokenizer(Choice):
    auto = "auto"  # the pretrained model's tokenizer for text when model.pretrained is set, else bytes
    bytes = "bytes"  # one token per byte (vocabulary 256)
    pretrained = "pretrained"  # the tokenizer of model.pretrained's checkpoint


SYNTHETIC_SOURCES = ("induction", "assoc_recall", "offset_diff", "copy", "translation", "translation_seq2seq")
TEXT_SOURCES = ("text", "pystdlib", "essays", "hub")
SEQ2SEQ_SOURCES = ("translation_seq2seq",)  # source and target sequences: an encoder-decoder's data
SOURCES = tuple(source.value for source in Source)
BYTE_VOCAB = 256  # text sources are byte-level


@dataclass
class DataConfig:
    source: Source = Source.induction
    seq_len: int = 64
    # Synthetic tasks: the token alphabet. Text sources are byte-level (256) unless tokenizer says otherwise.
    vocab_size: int = 64
    # Text sources: bytes, or the tokenizer of model.pretrained (auto: that one when model.pretrained is set).
    # Synthetic sources keep their own alphabet.
    tokenizer: Tokenizer = Tokenizer.auto
    # Text read with a checkpoint's tokenizer: its beginning-of-sequence token before each document (true) or not
    # (false); null: where that tokenizer puts one first itself (Gemma's), made true or false when the run starts.
    add_bos: bool | None = None
    seed: int = 0
    n_train: int = 16384  # synthetic: examples per split; text: at most this many chunks
    n_val: int = 512
    n_test: int = 512
    batch_size: int = 32
    num_workers: int = 0
    # assoc_recall: key-value pairs per sequence
    n_pairs: int = 8
    # offset_diff: token t predicts (x[t - offset_a] - x[t - offset_b]) mod vocab_size
    offset_a: int = 1
    offset_b: int = 3
    # text: a file or a folder of .txt files; pystdlib and essays ignore it
    path: str | None = None
    # text, essays and pystdlib: share of files (pystdlib) or of chunks (text, essays) held out for val and test
    val_fraction: float = 0.05
    test_fraction: float = 0.05
    # hub: a Hugging Face dataset by name (needs network once; cached after)
    hub_name: str | None = None
    hub_config: str | None = None
    text_field: str = "text"
    # Where processed data is cached; absolute, independent of Hydra's run directory.
    cache_dir: str = "${oc.env:HEADCOUNT_CACHE,${oc.env:HOME,/tmp}/.cache/headcount}"


def data_vocab_size(cfg: DataConfig) -> int | None:
    """Token ids lie in [0, this): the task alphabet for synthetic sources, bytes for text sources; None for text
    read with a pretrained tokenizer (headcount.pretrained checks that one against the model)."""
    check_choice("data.source", cfg.source, Source)
    if cfg.source in SYNTHETIC_SOURCES:
        return cfg.vocab_size
    return None if cfg.tokenizer == Tokenizer.pretrained else BYTE_VOCAB


def validate_data_section(cfg: DataConfig) -> None:
    """The checks every source shares; each synthetic task adds its own (data/synthetic.py) and the cache folder is
    checked where it is resolved (data/cache.py). Raises ConfigError naming the first bad key."""
    check_choice("data.source", cfg.source, Source)
    check_choice("data.tokenizer", cfg.tokenizer, Tokenizer)
    check_bools("data", cfg)
    check_seed("data.seed", cfg.seed)
    refuse_unused(cfg)
    for key, value, minimum in (
        ("seq_len", cfg.seq_len, 2),
        ("n_train", cfg.n_train, 1),
        ("n_val", cfg.n_val, 1),
        ("n_test", cfg.n_test, 1),
        ("batch_size", cfg.batch_size, 1),
        ("num_workers", cfg.num_workers, 0),
    ):
        if value < minimum:
            raise ConfigError(f"data.{key}", value, f"must be an integer >= {minimum}")
    if cfg.source in SYNTHETIC_SOURCES:
        if cfg.batch_size > cfg.n_train:
            raise ConfigError("data.batch_size", cfg.batch_size, f"must be at most data.n_train={cfg.n_train}")
        return
    for key, value in (("val_fraction", cfg.val_fraction), ("test_fraction", cfg.test_fraction)):
        if not 0 < value < 1:
            raise ConfigError(f"data.{key}", value, "must be strictly between 0 and 1")
    if cfg.val_fraction + cfg.test_fraction >= 1:
        raise ConfigError("data.test_fraction", cfg.test_fraction, "val_fraction + test_fraction must be below 1")
    if cfg.source == "hub" and cfg.hub_name is None:
        raise ConfigError("data.hub_name", None, "source hub needs a Hugging Face dataset name")
    if cfg.source == "text" and cfg.path is None:
        raise ConfigError("data.path", None, "source text needs a file or a folder of .txt files")


# The sources that read each source-specific key: set to anything but its default for another source, a key is
# refused rather than ignored (the run would look as if it had used it). (data.tokenizer is made concrete for every
# source, bytes for a synthetic task's own alphabet: pretrained.run_config.)
KEYS_READ_BY = {
    "n_pairs": ("assoc_recall",),
    "offset_a": ("offset_diff",),
    "offset_b": ("offset_diff",),
    "vocab_size": SYNTHETIC_SOURCES,  # text is bytes, or the checkpoint's tokens
    "path": ("text",),
    "val_fraction": TEXT_SOURCES,
    "test_fraction": TEXT_SOURCES,
    "hub_name": ("hub",),
    "hub_config": ("hub",),
    "text_field": ("hub",),
}


def refuse_unused(cfg: DataConfig) -> None:
    defaults = DataConfig()
    for key, sources in KEYS_READ_BY.items():
        value = getattr(cfg, key)
        if cfg.source not in sources and value != getattr(defaults, key):
            raise ConfigError(
                f"data.{key}",
                value,
                f"is read only by data.source={' or '.join(sources)}, not {cfg.source}: leave it unset",
            )
