"""Gemma 1, 2 and 3: Gemma's (1 + w) RMSNorm, token embeddings scaled by sqrt(d_model), GeGLU with GELU's tanh
approximation, rotary positions, grouped- or multi-query attention, tied unembedding.

- gemma: pre-norms only, scores scaled by 1 / sqrt(head_dim).
- gemma2: sandwich norms (pre and post around attention and the MLP), scores scaled by query_pre_attn_scalar^(-1/2),
  soft-capped attention scores and final logits, sliding-window layers alternating with full ones (layer_types).
- gemma3_text (Gemma3ForCausalLM; also what transformers makes of a Gemma 3 .gguf): Gemma 2's without the soft-caps
  unless set, plus an RMSNorm over each head's q and k (qk_norm=head), and per-layer-type rotary parameters: the
  sliding layers' base (rope_local_base_freq) unscaled, the full layers' base with their scaling (linear on the larger
  Gemma 3s).
- gemma3 (Gemma3ForConditionalGeneration, the image-text checkpoints): its text decoder, as gemma3_text; the vision
  tower and projector are not part of a text model and are left out.

Bidirectional attention (use_bidirectional_attention, the embedding variants) is refused by name.
"""

from typing import Any

from torch import Tensor

from headcount.config.model import Activation, AttentionConfig, ModelConfig, Norm, Positions, QKNorm
from headcount.model.attention import fuse_qkv
from headcount.pretrained.checks import (
    head_dim_setting,
    kv_heads_setting,
    layer_types_setting,
    refuse_if,
    rope,
    rope_n_ctx,
    unsupported,
)
from headcount.pretrained.weights import HFWeights, put_linear, put_norm

SANDWICH = ("gemma2", "gemma3_text", "gemma3")
VISION_PREFIXES = ("model.vision_tower.", "model.multi_modal_projector.")


def text_config(hf: Any) -> Any:
    return hf.get_text_config() if hf.model_type == "gemma3" else hf


def model_config(hf_config: Any, source: str) -> ModelConfig:
    model_type, hf = hf_config.model_type, text_config(hf_config)
    act = getattr(hf, "hidden_activation", None) or hf.hidden_act
    if act not in ("gelu_pytorch_tanh", "gelu_new", "gelu_fast"):
        raise unsupported(source, model_type, f"activation {act!r} (supported: gelu_pytorch_tanh, as GeGLU)")
    refuse_if(getattr(hf, "use_bidirectional_attention", False), source, model_type, "with bidirectional attention")
    window, layer_types = layer_types_setting(hf, source)
    params = getattr(hf, "rope_parameters", None) or {}
    theta_local = None
    if "full_attention" in params:  # Gemma 3: rotary parameters per layer type
        theta, fraction, scaling = rope(hf, source, params["full_attention"])
        local_theta, _, local_scaling = rope(hf, source, params.get("sliding_attention") or params["full_attention"])
        refuse_if(local_scaling.type != "default", source, model_type, "with rotary scaling on sliding layers")
        theta_local = local_theta if local_theta != theta else None
    else:
        theta, fraction, scaling = rope(hf, source)
    refuse_if(fraction != 1.0, source, model_type, f"with partial_rotary_factor={fraction}")
    n_heads = hf.num_attention_heads
    scalar = getattr(hf, "query_pre_attn_scalar", None)
    return ModelConfig(
        n_layers=hf.num_hidden_layers,
        d_model=hf.hidden_size,
        n_ctx=rope_n_ctx(hf, scaling),
        vocab_size=hf.vocab_size,
        attn=AttentionConfig(
            n_heads=n_heads,
            head_dim=head_dim_setting(hf.hidden_size, n_heads, hf.head_dim),
            qkv_bias=bool(hf.attention_bias),
            out_bias=bool(hf.attention_bias),
            n_kv_heads=kv_heads_setting(n_heads, hf.num_key_value_heads),
            query_pre_attn_scalar=None if scalar is None or scalar == hf.head_dim else float(scalar),
            softcap=getattr(hf, "attn_logit_softcapping", None),
        ),
        positions=Positions.rotary,
        rotary_theta=theta,
        rope_scaling=scaling,
        rotary_theta_local=theta_local,
        sliding_window=window,
        layer_types=layer_types,
        qk_norm=QKNorm.head if model_type in ("gemma3_text", "gemma3") else QKNorm.none,
        norm=Norm.rmsnorm_plus_one,
        norm_eps=hf.rms_norm_eps,
        post_norm=model_type in SANDWICH,
        embed_scale=True,
        final_softcap=getattr(hf, "final_logit_softcapping", None),
        mlp=True,
        mlp_hidden=hf.intermediate_size,
        mlp_act=Activation.geglu_tanh,
        mlp_bias=False,
        tie_embeddings=hf_config.tie_word_embeddings,
    )


def state_dict(hf: HFWeights, cfg: ModelConfig) -> dict[str, Tensor]:
    model = "model.language_model" if hf.model_type == "gemma3" else "model"
    for name in [n for n in hf.params if n.startswith(VISION_PREFIXES)]:
        hf.take(name)  # the image encoder: not part of the text model
    state = {"tok_emb.weight": hf.take(f"{model}.embed_tokens.weight")}
    for layer in range(cfg.n_layers):
        ours, theirs = f"blocks.{layer}", f"{model}.layers.{layer}"
        put_norm(state, f"{ours}.ln_attn", hf, f"{theirs}.input_layernorm")
        if cfg.post_norm:
            put_norm(state, f"{ours}.ln_attn_out", hf, f"{theirs}.post_attention_layernorm")
            put_norm(state, f"{ours}.ln_mlp", hf, f"{theirs}.pre_feedforward_layernorm")
            put_norm(state, f"{ours}.ln_mlp_out", hf, f"{theirs}.post_feedforward_layernorm")
        else:
            put_norm(state, f"{ours}.ln_mlp", hf, f"{theirs}.post_attention_layernorm")
        qkv = [hf.take_linear(f"{theirs}.self_attn.{name}_proj") for name in ("q", "k", "v")]
        put_linear(state, f"{ours}.attn.qkv", *fuse_qkv(qkv))
        put_linear(state, f"{ours}.attn.out", *hf.take_linear(f"{theirs}.self_attn.o_proj"))
        if cfg.qk_norm == QKNorm.head:
            put_norm(state, f"{ours}.attn.q_norm", hf, f"{theirs}.self_attn.q_norm")
            put_norm(state, f"{ours}.attn.k_norm", hf, f"{theirs}.self_attn.k_norm")
        put_linear(state, f"{ours}.mlp.gate", *hf.take_linear(f"{theirs}.mlp.gate_proj"))
        put_linear(state, f"{ours}.mlp.fc", *hf.take_linear(f"{theirs}.mlp.up_proj"))
        put_linear(state, f"{ours}.mlp.proj", *hf.take_linear(f"{theirs}.mlp.down_proj"))
    put_norm(state, "ln_f", hf, f"{model}.norm")
    state["lm_head.weight"] = hf.take("lm_head.weight")
    return state
