"""The supported families by transformers' model_type: each translates a config and moves the weights."""

from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from torch import Tensor

from headcount.config.model import ModelConfig
from headcount.errors import ConfigError
from headcount.pretrained import bart, bert, distilbert, gemma, gpt2, gpt_neox, llama, t5
from headcount.pretrained.checks import KEY
from headcount.pretrained.weights import HFWeights
from headcount.registry import Registry


@dataclass(frozen=True)
class Family:
    model_type: str  # transformers' config.model_type
    model_config: Callable[[Any, str], ModelConfig]
    state_dict: Callable[[HFWeights, ModelConfig], dict[str, Tensor]]

    @classmethod
    def of(cls, model_type: str, module: ModuleType) -> "Family":
        return cls(model_type, module.model_config, module.state_dict)


FAMILIES: Registry[Family] = Registry(
    "pretrained family", KEY, "a transformers model_type converted exactly into the model", named_by="model_type"
)
FAMILIES.register(Family.of("bart", bart))
FAMILIES.register(Family.of("bert", bert))
FAMILIES.register(Family.of("distilbert", distilbert))
FAMILIES.register(Family.of("electra", bert))
FAMILIES.register(Family.of("gemma", gemma))
FAMILIES.register(Family.of("gemma2", gemma))
FAMILIES.register(Family.of("gemma3", gemma))
FAMILIES.register(Family.of("gemma3_text", gemma))
FAMILIES.register(Family.of("gpt2", gpt2))
FAMILIES.register(Family.of("gpt_neox", gpt_neox))
FAMILIES.register(Family.of("llama", llama))
FAMILIES.register(Family.of("marian", bart))
FAMILIES.register(Family.of("mistral", llama))
FAMILIES.register(Family.of("olmo2", llama))
FAMILIES.register(Family.of("phi3", llama))
FAMILIES.register(Family.of("qwen2", llama))
FAMILIES.register(Family.of("qwen3", llama))
FAMILIES.register(Family.of("roberta", bert))
FAMILIES.register(Family.of("t5", t5))
SUPPORTED = tuple(sorted(FAMILIES))


ENCODERS = ("bert", "distilbert", "electra", "roberta")  # bidirectional: read as *ForMaskedLM or the bare *Model
ENCODER_DECODERS = ("bart", "marian", "t5")  # read as *ForConditionalGeneration (AutoModelForSeq2SeqLM)


def auto_model_class(transformers: Any, hf_config: Any, source: str) -> Any:
    """The transformers Auto class that reads a checkpoint of this config: a causal LM, or for an encoder its
    masked-LM model or, for a bare encoder (sentence-transformers' checkpoints), AutoModel."""
    if hf_config.model_type in ENCODER_DECODERS:
        return transformers.AutoModelForSeq2SeqLM
    if hf_config.model_type not in ENCODERS:
        return transformers.AutoModelForCausalLM
    return transformers.AutoModelForMaskedLM if bert.has_mlm_head(hf_config, source) else transformers.AutoModel


def family(model_type: str, source: str) -> Family:
    if model_type not in FAMILIES:
        supported = FAMILIES.allowed(model_type).removeprefix("allowed: ")
        raise ConfigError(
            KEY, source, f"architecture {model_type!r} is not supported; supported model types: {supported}"
        )
    return FAMILIES[model_type]
