"""A command's config with model.pretrained set, made concrete: the model section becomes the architecture the
checkpoint implies, and data.tokenizer=auto becomes bytes or pretrained. Every disagreement is one line, before any
work.

The checkpoint sets every shape key. A model key that differs both from its default and from the checkpoint's value
(typed on the command line, or set by a model preset such as model=tiny) is refused rather than silently replaced;
model.dropout stays the user's (fine-tuning may want it). The checkpoint's config and tokenizer are read once per
process (a GGUF file's config costs as much to read as its weights).
"""

import os
from functools import lru_cache
from typing import Any

from omegaconf import DictConfig, OmegaConf, open_dict

from headcount.config import plain, typed
from headcount.config.data import TEXT_SOURCES, DataConfig, Tokenizer
from headcount.config.model import ModelConfig
from headcount.data.tokens import puts_bos_first
from headcount.errors import ConfigError
from headcount.pretrained.load import Pretrained, load_pretrained, load_tokenizer, pretrained_config
from headcount.pretrained.tokenizer import PretrainedTokenizer

NOT_SHAPE = ("pretrained", "dropout")


@lru_cache(maxsize=8)
def implied_config(source: str) -> ModelConfig:
    return pretrained_config(source)


@lru_cache(maxsize=8)
def raw_tokenizer(source: str) -> Any:
    return load_tokenizer(source)


@lru_cache(maxsize=8)
def checkpoint_tokenizer(source: str, bos: bool = False) -> PretrainedTokenizer:
    return PretrainedTokenizer(raw_tokenizer(source), source, bos)


def concrete_bos(model: ModelConfig, data: DataConfig) -> bool | None:
    """data.add_bos with null decided: for text read with the checkpoint's tokenizer, whether that tokenizer puts
    its BOS first itself (Gemma's does); None (nothing to add) for bytes and synthetic data. ConfigError for a BOS
    asked of data that has no tokenizer with one."""
    if data.tokenizer != Tokenizer.pretrained:
        if data.add_bos:
            raise ConfigError("data.add_bos", True, "needs text read with a checkpoint's tokenizer (model.pretrained)")
        return None
    tokenizer = raw_tokenizer(model.pretrained)
    if data.add_bos and tokenizer.bos_token_id is None:
        why = f"the tokenizer of {model.pretrained} has no beginning-of-sequence token"
        raise ConfigError("data.add_bos", True, why)
    return puts_bos_first(tokenizer) if data.add_bos is None else data.add_bos


def flat(section: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in section.items():
        out.update(flat(value, f"{prefix}{key}.") if isinstance(value, dict) else {f"{prefix}{key}": value})
    return out


def refuse_disagreement(model: ModelConfig, implied: ModelConfig) -> None:
    given, default, wanted = flat(plain(model)), flat(plain(ModelConfig())), flat(plain(implied))
    for key, value in given.items():
        if key not in NOT_SHAPE and value != default[key] and value != wanted[key]:
            raise ConfigError(
                f"model.{key}",
                value,
                f"model.pretrained={model.pretrained} sets the architecture ({key}={wanted[key]}); leave model.{key} "
                "unset (and use no shape preset such as model=tiny)",
            )


def concrete_tokenizer(model: ModelConfig, data: DataConfig) -> Tokenizer:
    """data.tokenizer with auto decided: the checkpoint's for text when model.pretrained is set, else bytes."""
    choice = Tokenizer(data.tokenizer)
    text = data.source in TEXT_SOURCES
    if choice == Tokenizer.auto:
        return Tokenizer.pretrained if model.pretrained and text else Tokenizer.bytes
    if choice == Tokenizer.pretrained and model.pretrained is None:
        raise ConfigError("data.tokenizer", "pretrained", "needs model.pretrained (the checkpoint with the tokenizer)")
    if choice == Tokenizer.pretrained and not text:
        raise ConfigError(
            "data.tokenizer",
            "pretrained",
            f"data.source={data.source} has its own alphabet; a tokenizer reads text ({', '.join(TEXT_SOURCES)})",
        )
    return choice


def check_vocabulary(model: ModelConfig, data: DataConfig) -> None:
    """The data's tokens must be tokens of the model: its tokenizer within its vocabulary, bytes only if its tokenizer
    is byte-level."""
    if data.source not in TEXT_SOURCES:
        return  # the synthetic alphabet against model.vocab_size: config.schema checks it
    tokenizer = checkpoint_tokenizer(model.pretrained)
    if data.tokenizer == Tokenizer.bytes and not tokenizer.is_byte_level():
        raise ConfigError(
            "data.tokenizer",
            "bytes",
            f"model.pretrained={model.pretrained} reads its own tokens, not bytes: use data.tokenizer=pretrained",
        )
    if tokenizer.vocab_size > model.vocab_size:
        raise ConfigError(
            "data.tokenizer",
            str(data.tokenizer),
            f"the tokenizer of {model.pretrained} has {tokenizer.vocab_size} tokens, more than the model's vocabulary "
            f"({model.vocab_size})",
        )


def resolve_pretrained(cfg: DictConfig) -> DictConfig:
    """A copy of cfg (a train config: model, data, ...) with data.tokenizer concrete and, when model.pretrained is
    set, the model section the checkpoint implies; ConfigError for a disagreement. Resolving twice changes nothing."""
    model, data = typed(cfg.model, ModelConfig), typed(cfg.data, DataConfig)
    data.tokenizer = concrete_tokenizer(model, data)
    out = cfg.copy()
    with open_dict(out):
        out.data.tokenizer = data.tokenizer.value
        out.data.add_bos = concrete_bos(model, data)
        if model.pretrained and OmegaConf.select(out, "task.add_special_tokens", default=False) is None:
            # recorded as decided: the checkpoint's tokenizer's special tokens where it puts a BOS first (Gemma)
            out.task.add_special_tokens = puts_bos_first(raw_tokenizer(model.pretrained))
    if model.pretrained is None:
        return out
    implied = implied_config(model.pretrained)
    refuse_disagreement(model, implied)
    implied.pretrained, implied.dropout = model.pretrained, model.dropout
    check_vocabulary(implied, data)
    if data.seq_len > implied.n_ctx:
        raise ConfigError(
            "data.seq_len", data.seq_len, f"must be at most {model.pretrained}'s context ({implied.n_ctx})"
        )
    with open_dict(out):
        out.model = OmegaConf.merge(out.model, plain(implied))
    return out


def text_tokenizer(cfg: DictConfig) -> PretrainedTokenizer | None:
    """The tokenizer a config's text data is read with (resolved or not); None for bytes (and synthetic data)."""
    model, data = typed(cfg.model, ModelConfig), typed(cfg.data, DataConfig)
    data.tokenizer = concrete_tokenizer(model, data)
    if data.tokenizer != Tokenizer.pretrained:
        return None
    return checkpoint_tokenizer(model.pretrained, bool(concrete_bos(model, data)))


@lru_cache(maxsize=1)
def cached_pretrained(source: str) -> Pretrained:
    """load_pretrained, once per process for the last source (a command that prepares a run and then ablates it
    reads the checkpoint once); quiet, as load_pretrained is, unless a command was started with -v (train/quiet.py
    records the level in HEADCOUNT_VERBOSITY; a Python session that opens a pretrained run has none)."""
    return load_pretrained(source, verbose=os.environ.get("HEADCOUNT_VERBOSITY", "0") not in ("", "0"))
