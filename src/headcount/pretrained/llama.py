"""Llama and its kin: rotary positions (scaled or not), RMSNorm, SwiGLU, grouped-query attention, no biases. The kin
differ in a few keys of headcount's model:

- llama (Llama 1/2/3.x, SmolLM): rope_type llama3, linear, dynamic or yarn when the config scales its rotary positions.
- mistral: a sliding window on every layer.
- qwen2: q, k and v biases; sliding windows on the layers from max_window_layers on (use_sliding_window).
- qwen3: an RMSNorm over each head's q and k (qk_norm=head); sliding windows as Qwen2.
- olmo2: no pre-norms but norms on attention's and the MLP's outputs (post_norm), and an RMSNorm over the whole q and
  k projections before the head split (qk_norm=projection).
- phi3: fused qkv_proj (already headcount's [q | k | v] rows) and gate_up_proj (split into gate and up), partial
  rotary (partial_rotary_factor), a sliding window on every layer when set; longrope scaling is refused by name.

q_proj, k_proj and v_proj stack into headcount's fused rows [q | k | v]; rotary positions use the same "rotate half"
pairing as transformers, so no permutation is needed (transformers' GGUF loader undoes llama.cpp's). Llama's rotary
embedding rotates every head dimension whatever partial_rotary_factor says, and so does the converted model; Phi-3's
rotates the leading fraction.
"""

from typing import Any

from torch import Tensor

from headcount.config.model import Activation, AttentionConfig, ModelConfig, Norm, Positions, QKNorm
from headcount.model.attention import fuse_qkv
from headcount.pretrained.checks import (
    head_dim_setting,
    kv_heads_setting,
    layer_types_setting,
    rope,
    rope_n_ctx,
    unsupported,
)
from headcount.pretrained.weights import HFWeights, put_linear, put_norm

QK_NORM = {"qwen3": QKNorm.head, "olmo2": QKNorm.projection}


def model_config(hf: Any, source: str) -> ModelConfig:
    model_type = hf.model_type
    if hf.hidden_act not in ("silu", "swish"):
        raise unsupported(source, model_type, f"hidden_act={hf.hidden_act!r} (supported: silu, as SwiGLU)")
    window, layer_types = layer_types_setting(hf, source)
    theta, fraction, scaling = rope(hf, source)
    if model_type == "qwen2":  # Qwen2 always has q, k, v biases and no output bias
        qkv_bias, out_bias = True, False
    else:
        qkv_bias = out_bias = bool(getattr(hf, "attention_bias", False))
    n_heads = hf.num_attention_heads
    head_dim = getattr(hf, "head_dim", None) or hf.hidden_size // n_heads
    return ModelConfig(
        n_layers=hf.num_hidden_layers,
        d_model=hf.hidden_size,
        n_ctx=rope_n_ctx(hf, scaling),
        vocab_size=hf.vocab_size,
        attn=AttentionConfig(
            n_heads=n_heads,
            head_dim=head_dim_setting(hf.hidden_size, n_heads, head_dim),
            qkv_bias=qkv_bias,
            out_bias=out_bias,
            n_kv_heads=kv_heads_setting(n_heads, hf.num_key_value_heads),
        ),
        positions=Positions.rotary,
        rotary_theta=theta,
        rotary_fraction=fraction if model_type == "phi3" else 1.0,
        rope_scaling=scaling,
        sliding_window=window,
        layer_types=layer_types,
        qk_norm=QK_NORM.get(model_type, QKNorm.none),
        norm=Norm.rmsnorm,
        norm_eps=hf.rms_norm_eps,
        pre_norm=model_type != "olmo2",
        post_norm=model_type == "olmo2",
        mlp=True,
        mlp_hidden=hf.intermediate_size,
        mlp_act=Activation.swiglu,
        mlp_bias=bool(getattr(hf, "mlp_bias", False)),
        tie_embeddings=hf.tie_word_embeddings,
    )


def state_dict(hf: HFWeights, cfg: ModelConfig) -> dict[str, Tensor]:
    state = {"tok_emb.weight": hf.take("model.embed_tokens.weight")}
    for layer in range(cfg.n_layers):
        ours, theirs = f"blocks.{layer}", f"model.layers.{layer}"
        if hf.model_type == "olmo2":  # post-norms only
            put_norm(state, f"{ours}.ln_attn_out", hf, f"{theirs}.post_attention_layernorm")
            put_norm(state, f"{ours}.ln_mlp_out", hf, f"{theirs}.post_feedforward_layernorm")
        else:
            put_norm(state, f"{ours}.ln_attn", hf, f"{theirs}.input_layernorm")
            put_norm(state, f"{ours}.ln_mlp", hf, f"{theirs}.post_attention_layernorm")
        if hf.model_type == "phi3":  # fused [q | k | v] rows, headcount's layout; gate_up is [gate | up]
            put_linear(state, f"{ours}.attn.qkv", *hf.take_linear(f"{theirs}.self_attn.qkv_proj"))
            gate, up = hf.take(f"{theirs}.mlp.gate_up_proj.weight").chunk(2, dim=0)
            state[f"{ours}.mlp.gate.weight"], state[f"{ours}.mlp.fc.weight"] = gate, up
        else:
            qkv = [hf.take_linear(f"{theirs}.self_attn.{name}_proj") for name in ("q", "k", "v")]
            put_linear(state, f"{ours}.attn.qkv", *fuse_qkv(qkv))
            put_linear(state, f"{ours}.mlp.gate", *hf.take_linear(f"{theirs}.mlp.gate_proj"))
            put_linear(state, f"{ours}.mlp.fc", *hf.take_linear(f"{theirs}.mlp.up_proj"))
        if cfg.qk_norm != QKNorm.none:
            put_norm(state, f"{ours}.attn.q_norm", hf, f"{theirs}.self_attn.q_norm")
            put_norm(state, f"{ours}.attn.k_norm", hf, f"{theirs}.self_attn.k_norm")
        put_linear(state, f"{ours}.attn.out", *hf.take_linear(f"{theirs}.self_attn.o_proj"))
        put_linear(state, f"{ours}.mlp.proj", *hf.take_linear(f"{theirs}.mlp.down_proj"))
    put_norm(state, "ln_f", hf, "model.norm")
    state["lm_head.weight"] = hf.take("lm_head.weight")
    return state
