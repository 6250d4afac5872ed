"""Data sources as components: each `data.source` value is registered in `DATA_SOURCES` where it is defined, a
synthetic task (its checks and generator, data/synthetic.py) or a text source (its split builder, data/text.py), with a
line saying what it is.
`headcount.components` lists them with the other components."""

from collections.abc import Callable
from typing import Any, NamedTuple

from headcount.registry import Registry


class SyntheticSource(NamedTuple):
    name: str  # the data.source value
    check: Callable[[Any], None]  # raises ConfigError when the task cannot be built from the DataConfig
    make: Callable[..., Any]  # (rng, n, cfg) -> (input_ids, loss_mask) arrays
    doc: str


class TextSource(NamedTuple):
    name: str  # the data.source value
    build: Callable[..., Any]  # (cfg, tokenizer) -> the train/val/test DatasetDict
    doc: str


DATA_SOURCES: Registry[SyntheticSource | TextSource] = Registry(
    "data source", "data.source", "the examples a run trains on and ablations measure loss on"
)


def synthetic_sources() -> list[str]:
    """The synthetic tasks, in the order registered (their index seeds their random stream)."""
    return [name for name in DATA_SOURCES if isinstance(DATA_SOURCES[name], SyntheticSource)]
