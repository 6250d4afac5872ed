"""Llama and its kin (SmolLM, Qwen2): rotary positions, RMSNorm, SwiGLU, grouped-query attention, no biases (Qwen2:
q, k and v biases).

q_proj, k_proj and v_proj stack into headcount's fused rows [q | k | v]; rotary positions use the same "rotate half"
pairing as transformers, so no permutation is needed (transformers' GGUF loader undoes llama.cpp's). Llama's rotary
embedding rotates every head dimension whatever partial_rotary_factor says, and so does the converted model.
"""

from typing import Any

from torch import Tensor

from headcount.config.model import Activation, AttentionConfig, ModelConfig, Norm, Positions
from headcount.model.attention import fuse_qkv
from headcount.pretrained.checks import head_dim_setting, kv_heads_setting, refuse_if, rope, unsupported
from headcount.pretrained.weights import HFWeights, put_linear, put_norm


def model_config(hf: Any, source: str) -> ModelConfig:
    model_type = hf.model_type
    if hf.hidden_act not in ("silu", "swish"):
        raise unsupported(source, model_type, f"hidden_act={hf.hidden_act!r} (supported: silu, as SwiGLU)")
    sliding = [t for t in getattr(hf, "layer_types", None) or [] if t != "full_attention"]
    refuse_if(bool(sliding), source, model_type, f"with sliding-window attention (layer types {sorted(set(sliding))})")
    theta, _ = rope(hf, source)
    if model_type == "qwen2":  # Qwen2 always has q, k, v biases and no output bias
        qkv_bias, out_bias = True, False
    else:
        qkv_bias = out_bias = bool(hf.attention_bias)
    n_heads = hf.num_attention_heads
    head_dim = getattr(hf, "head_dim", None) or hf.hidden_size // n_heads
    return ModelConfig(
        n_layers=hf.num_hidden_layers,
        d_model=hf.hidden_size,
        n_ctx=hf.max_position_embeddings,
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
        norm=Norm.rmsnorm,
        norm_eps=hf.rms_norm_eps,
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
        put_norm(state, f"{ours}.ln_attn", hf, f"{theirs}.input_layernorm")
        qkv = [hf.take_linear(f"{theirs}.self_attn.{name}_proj") for name in ("q", "k", "v")]
        put_linear(state, f"{ours}.attn.qkv", *fuse_qkv(qkv))
        put_linear(state, f"{ours}.attn.out", *hf.take_linear(f"{theirs}.self_attn.o_proj"))
        put_norm(state, f"{ours}.ln_mlp", hf, f"{theirs}.post_attention_layernorm")
        put_linear(state, f"{ours}.mlp.gate", *hf.take_linear(f"{theirs}.mlp.gate_proj"))
        put_linear(state, f"{ours}.mlp.fc", *hf.take_linear(f"{theirs}.mlp.up_proj"))
        put_linear(state, f"{ours}.mlp.proj", *hf.take_linear(f"{theirs}.mlp.down_proj"))
    put_norm(state, "ln_f", hf, "model.norm")
    state["lm_head.weight"] = hf.take("lm_head.weight")
    return state
