"""What a Hugging Face config must say for headcount to reproduce it exactly; everything else is refused by name."""

from typing import Any

from headcount.config.model import Activation
from headcount.errors import ConfigError

KEY = "model.pretrained"

GELU_ACTIVATIONS = {
    "gelu": Activation.gelu,
    "gelu_new": Activation.gelu_tanh,  # GPT-2's tanh approximation
    "gelu_pytorch_tanh": Activation.gelu_tanh,
    "gelu_fast": Activation.gelu_tanh,  # the same approximation, written differently
}


def unsupported(source: str, model_type: str, what: str) -> ConfigError:
    return ConfigError(KEY, source, f"{model_type} {what} is not supported by headcount's model")


def refuse_if(condition: bool, source: str, model_type: str, what: str) -> None:
    if condition:
        raise unsupported(source, model_type, what)


def gelu_activation(hf: Any, name: str, source: str) -> Activation:
    act = getattr(hf, name)
    if act not in GELU_ACTIVATIONS:
        raise unsupported(source, hf.model_type, f"{name}={act!r} (supported: {', '.join(GELU_ACTIVATIONS)})")
    return GELU_ACTIVATIONS[act]


def rope(hf: Any, source: str) -> tuple[float, float]:
    """(theta, partial_rotary_factor) of a config with plain rotary positions; scaled variants are refused."""
    params = dict(getattr(hf, "rope_parameters", None) or {})
    rope_type = params.get("rope_type", params.get("type", "default"))
    refuse_if(rope_type != "default", source, hf.model_type, f"rotary scaling rope_type={rope_type!r}")
    return float(params.get("rope_theta", 10000.0)), float(params.get("partial_rotary_factor", 1.0))


def head_dim_setting(d_model: int, n_heads: int, head_dim: int) -> int | None:
    """headcount's attn.head_dim: null when the heads split d_model (the flat-cost rule gives the same width)."""
    return None if head_dim * n_heads == d_model else head_dim


def kv_heads_setting(n_heads: int, n_kv_heads: int | None) -> int | None:
    """headcount's attn.n_kv_heads: null when every query head has its own key/value head."""
    return None if n_kv_heads in (None, n_heads) else n_kv_heads
