"""What a Hugging Face config must say for headcount to reproduce it exactly; everything else is refused by name."""

import math
from typing import Any

from headcount.config.model import ROPE_KEYS_USED_BY, Activation, RopeScalingConfig, RopeType
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


ROPE_TYPES = ("default", "linear", "dynamic", "yarn", "llama3")


def rope(hf: Any, source: str, params: dict | None = None) -> tuple[float, float, RopeScalingConfig]:
    """(theta, partial_rotary_factor, scaling) of a config's rotary positions (or of `params`, one layer type's
    rope_parameters): rope_type default, linear, dynamic, yarn or llama3; any other (longrope, ...) is refused."""
    if params is None:
        params = getattr(hf, "rope_parameters", None) or {}
    params = dict(params)
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type not in ROPE_TYPES:
        what = f"rotary scaling rope_type={rope_type!r} (supported: {', '.join(ROPE_TYPES)})"
        raise unsupported(source, hf.model_type, what)
    theta, fraction = float(params.get("rope_theta", 10000.0)), float(params.get("partial_rotary_factor", 1.0))
    if rope_type == "default":
        return theta, fraction, RopeScalingConfig()
    original = params.get("original_max_position_embeddings")
    if rope_type == "dynamic":  # transformers' dynamic NTK counts from max_position_embeddings
        original = hf.max_position_embeddings
    factor = params.get("factor")
    if factor is None and rope_type == "yarn":
        factor = hf.max_position_embeddings / original
    settings = {
        "factor": float(factor),
        "original_n_ctx": None if original is None else int(original),
        "low_freq_factor": float(params.get("low_freq_factor", 1.0)),
        "high_freq_factor": float(params.get("high_freq_factor", 4.0)),
        "beta_fast": float(params.get("beta_fast") or 32.0),
        "beta_slow": float(params.get("beta_slow") or 1.0),
        "attention_factor": yarn_attention_factor(params, float(factor)) if rope_type == "yarn" else None,
        "truncate": bool(params.get("truncate", True)),
    }
    # only the keys this type reads (a linear config's original_max_position_embeddings is not one of them): the
    # model config refuses the others set
    used = {key: value for key, value in settings.items() if rope_type in ROPE_KEYS_USED_BY[key]}
    return theta, fraction, RopeScalingConfig(type=RopeType(rope_type), **used)


def yarn_attention_factor(params: dict, factor: float) -> float | None:
    """YaRN's cos/sin scale as transformers infers it: attention_factor, else from mscale and mscale_all_dim, else
    null (headcount's default, 0.1 ln(factor) + 1)."""
    if params.get("attention_factor") is not None:
        return float(params["attention_factor"])
    mscale, mscale_all_dim = params.get("mscale"), params.get("mscale_all_dim")
    if not (mscale and mscale_all_dim) or factor <= 1:
        return None
    return float((0.1 * mscale * math.log(factor) + 1.0) / (0.1 * mscale_all_dim * math.log(factor) + 1.0))


def rope_n_ctx(hf: Any, scaling: RopeScalingConfig) -> int:
    """headcount's n_ctx: max_position_embeddings, or for dynamic NTK (which only acts beyond it) factor times it."""
    if scaling.type == RopeType.dynamic:
        return int(hf.max_position_embeddings * scaling.factor)
    return hf.max_position_embeddings


def layer_types_setting(hf: Any, source: str) -> tuple[int | None, list[str] | None]:
    """headcount's (sliding_window, layer_types) from transformers' sliding_window and layer_types: no window when
    every layer is full, layer_types null when every layer is alike (Mistral: every layer slides)."""
    window = getattr(hf, "sliding_window", None)
    types = list(getattr(hf, "layer_types", None) or [])
    if not types:
        types = ["sliding_attention" if window is not None else "full_attention"] * hf.num_hidden_layers
    unknown = sorted(set(types) - {"full_attention", "sliding_attention"})
    refuse_if(
        bool(unknown), source, hf.model_type, f"with layer types {unknown} (supported: full and sliding attention)"
    )
    ours = ["sliding" if t == "sliding_attention" else "full" for t in types]
    if "sliding" not in ours or window is None:  # transformers' sliding layers without a window attend to everything
        return None, None
    return int(window), None if set(ours) == {"sliding"} else ours


def head_dim_setting(d_model: int, n_heads: int, head_dim: int) -> int | None:
    """headcount's attn.head_dim: null when the heads split d_model (the flat-cost rule gives the same width)."""
    return None if head_dim * n_heads == d_model else head_dim


def kv_heads_setting(n_heads: int, n_kv_heads: int | None) -> int | None:
    """headcount's attn.n_kv_heads: null when every query head has its own key/value head."""
    return None if n_kv_heads in (None, n_heads) else n_kv_heads
