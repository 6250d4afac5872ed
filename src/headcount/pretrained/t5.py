"""T5 (v1.0 and v1.1; transformers' T5ForConditionalGeneration) as an encoder-decoder: pre-norm RMSNorm blocks with no
biases, scores q k^T without the 1 / sqrt(head_dim) factor (T5 folds it into its initialisation: scale 1 is
query_pre_attn_scalar = 1), the relative position bias of each stack's first layer shared by its layers
(bidirectional in the encoder, causal in the decoder; none in cross-attention), a final norm on both stacks, and one
token embedding shared by the encoder, the decoder and (v1.0) the unembedding, whose input is then scaled by
d_model^(-1/2). v1.0's FFN is ReLU, v1.1's gated GELU (tanh) with its own unembedding.

transformers 5 ties T5's unembedding to the shared embedding whatever the config says, and reads the saved config's
`tie_word_embeddings: false` (v1.1) as "do not scale" (config.scale_decoder_outputs). headcount's model ties and
scales when scale_decoder_outputs is true (v1.0), and keeps its own unembedding, unscaled, otherwise (v1.1).
"""

from typing import Any

import torch
from torch import Tensor

from headcount.config.model import Activation, AttentionConfig, ModelConfig, Norm, Positions
from headcount.model.attention import fuse_qkv
from headcount.pretrained.checks import head_dim_setting, refuse_if, unsupported
from headcount.pretrained.weights import HFWeights, put_linear, put_norm

# feed_forward_proj: (gated, transformers' dense_act_fn) -> headcount's mlp_act
ACTIVATIONS = {
    (False, "relu"): Activation.relu,
    (False, "gelu"): Activation.gelu,
    (False, "gelu_new"): Activation.gelu_tanh,
    (True, "gelu_new"): Activation.geglu_tanh,
    (True, "silu"): Activation.swiglu,
}


def model_config(hf: Any, source: str) -> ModelConfig:
    act = ACTIVATIONS.get((bool(hf.is_gated_act), hf.dense_act_fn))
    if act is None:
        raise unsupported(source, hf.model_type, f"feed_forward_proj={hf.feed_forward_proj!r}")
    refuse_if(getattr(hf, "is_decoder", False), source, hf.model_type, "as a decoder alone (is_decoder)")
    scaled = bool(getattr(hf, "scale_decoder_outputs", hf.tie_word_embeddings))
    return ModelConfig(
        n_layers=hf.num_decoder_layers,
        encoder_layers=hf.num_layers,
        d_model=hf.d_model,
        n_ctx=getattr(hf, "n_positions", None) or 512,  # relative positions: any length; this bounds the inputs
        vocab_size=hf.vocab_size,
        attn=AttentionConfig(
            n_heads=hf.num_heads,
            head_dim=head_dim_setting(hf.d_model, hf.num_heads, hf.d_kv),
            qkv_bias=False,
            out_bias=False,
            query_pre_attn_scalar=1.0,
        ),
        positions=Positions.relative,
        relative_buckets=hf.relative_attention_num_buckets,
        relative_max_distance=hf.relative_attention_max_distance,
        norm=Norm.rmsnorm,
        norm_eps=hf.layer_norm_epsilon,
        mlp=True,
        mlp_hidden=hf.d_ff,
        mlp_act=act,
        mlp_bias=False,
        tie_embeddings=scaled,
        unembed_scale=scaled,
    )


def put_attention(state: dict[str, Tensor], ours: str, hf: HFWeights, theirs: str) -> None:
    qkv = [hf.take_linear(f"{theirs}.{name}") for name in ("q", "k", "v")]
    put_linear(state, f"{ours}.qkv", *fuse_qkv(qkv))
    put_linear(state, f"{ours}.out", *hf.take_linear(f"{theirs}.o"))


def put_stack(state: dict[str, Tensor], hf: HFWeights, stack: str, n_layers: int, gated: bool) -> None:
    decoder = stack == "decoder"
    for layer in range(n_layers):
        ours, theirs = f"{stack}.blocks.{layer}", f"{stack}.block.{layer}.layer"
        put_attention(state, f"{ours}.attn", hf, f"{theirs}.0.SelfAttention")
        put_norm(state, f"{ours}.ln_attn", hf, f"{theirs}.0.layer_norm")
        if decoder:
            put_attention(state, f"{ours}.cross", hf, f"{theirs}.1.EncDecAttention")
            put_norm(state, f"{ours}.ln_cross", hf, f"{theirs}.1.layer_norm")
        ff = f"{theirs}.{2 if decoder else 1}"
        mlp = f"{ff}.DenseReluDense"
        if gated:
            put_linear(state, f"{ours}.mlp.gate", *hf.take_linear(f"{mlp}.wi_0"))
            put_linear(state, f"{ours}.mlp.fc", *hf.take_linear(f"{mlp}.wi_1"))
        else:
            put_linear(state, f"{ours}.mlp.fc", *hf.take_linear(f"{mlp}.wi"))
        put_linear(state, f"{ours}.mlp.proj", *hf.take_linear(f"{mlp}.wo"))
        put_norm(state, f"{ours}.ln_mlp", hf, f"{ff}.layer_norm")
    bias = f"{stack}.block.0.layer.0.SelfAttention.relative_attention_bias.weight"
    state[f"{stack}.rel_bias.rel_emb.weight"] = hf.take(bias)
    put_norm(state, f"{stack}.ln_f", hf, f"{stack}.final_layer_norm")


def state_dict(hf: HFWeights, cfg: ModelConfig) -> dict[str, Tensor]:
    shared = hf.take("shared.weight")
    state = {"encoder.tok_emb.weight": shared, "decoder.tok_emb.weight": shared}
    for name in ("encoder.embed_tokens.weight", "decoder.embed_tokens.weight"):  # the shared embedding again
        hf.take_optional(name)
    gated = cfg.mlp_act in (Activation.geglu_tanh, Activation.swiglu)
    put_stack(state, hf, "encoder", cfg.encoder_layers, gated)
    put_stack(state, hf, "decoder", cfg.n_layers, gated)
    head = hf.take("lm_head.weight")
    if cfg.tie_embeddings and not (head is shared or torch.equal(head, shared)):
        raise unsupported(hf.model_type, hf.model_type, "with scaled decoder outputs and its own unembedding")
    state["decoder.lm_head.weight"] = shared if cfg.tie_embeddings else head
    return state
