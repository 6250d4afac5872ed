"""The supported families by transformers' model_type: each translates a config and moves the weights."""

from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from torch import Tensor

from headcount.config.model import ModelConfig
from headcount.errors import ConfigError
from headcount.pretrained import gemma, gpt2, gpt_neox, llama
from headcount.pretrained.checks import KEY
from headcount.pretrained.weights import HFWeights


@dataclass(frozen=True)
class Family:
    model_config: Callable[[Any, str], ModelConfig]
    state_dict: Callable[[HFWeights, ModelConfig], dict[str, Tensor]]

    @classmethod
    def of(cls, module: ModuleType) -> "Family":
        return cls(module.model_config, module.state_dict)


FAMILIES = {
    "gemma": Family.of(gemma),
    "gemma2": Family.of(gemma),
    "gemma3": Family.of(gemma),
    "gemma3_text": Family.of(gemma),
    "gpt2": Family.of(gpt2),
    "gpt_neox": Family.of(gpt_neox),
    "llama": Family.of(llama),
    "mistral": Family.of(llama),
    "olmo2": Family.of(llama),
    "phi3": Family.of(llama),
    "qwen2": Family.of(llama),
    "qwen3": Family.of(llama),
}
SUPPORTED = tuple(sorted(FAMILIES))


def family(model_type: str, source: str) -> Family:
    if model_type not in FAMILIES:
        raise ConfigError(
            KEY, source, f"architecture {model_type!r} is not supported; supported model types: {', '.join(SUPPORTED)}"
        )
    return FAMILIES[model_type]
