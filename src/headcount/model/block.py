"""One transformer layer: attention, then an optional MLP, each added to the residual stream, one after the other or,
with parallel_residual (GPT-NeoX), both read from the block's input. Each may have a norm on its input (pre_norm:
ln_attn, ln_mlp) and on its output before the addition (post_norm: ln_attn_out, ln_mlp_out; Gemma 2/3 have both, a
"sandwich", OLMo 2 only the second).

`Block.forward` is heads -> gate -> finish: the attention module produces z, gates it, and `finish` takes the block
input and that z the rest of the way (combine heads, project, post-norm, add, MLP). The ablation evaluator calls the
same `finish` on a cached z, so the model and the evaluator share one code path, and a post-attention norm acts after
the heads combine: gating z means the same with or without it.

A layer's type (model.layer_types: full or sliding) sets its attention window and, with rotary_theta_local, its
rotary base (Gemma 3's local layers use their own base, unscaled, its global layers the scaled one).
"""

from torch import Tensor, nn

from headcount.config.model import (
    LayerType,
    ModelConfig,
    Norm,
    Positions,
    RopeScalingConfig,
    resolve_layer_types,
    rotary_dims,
)
from headcount.model.attention import AttentionFeatures, MultiHeadAttention
from headcount.model.mlp import MLP
from headcount.model.norm import make_norm
from headcount.model.rotary import Rotary


def layer_rotary(cfg: ModelConfig, layer_type: str) -> Rotary | None:
    """The rotary positions of a layer of this type: the local base unscaled on sliding layers when
    rotary_theta_local is set, else rotary_theta with the model's rotary scaling."""
    if cfg.positions != Positions.rotary:
        return None
    if layer_type == LayerType.sliding and cfg.rotary_theta_local is not None:
        return Rotary(rotary_dims(cfg), cfg.rotary_theta_local, RopeScalingConfig(), cfg.n_ctx)
    return Rotary(rotary_dims(cfg), cfg.rotary_theta, cfg.rope_scaling, cfg.n_ctx)


def layer_features(cfg: ModelConfig, layer_type: str) -> AttentionFeatures:
    scalar = cfg.attn.query_pre_attn_scalar
    return AttentionFeatures(
        window=cfg.sliding_window if layer_type == LayerType.sliding else None,
        scale=None if scalar is None else scalar**-0.5,
        softcap=cfg.attn.softcap,
        qk_norm=str(cfg.qk_norm),
        qk_norm_plus_one=cfg.norm == Norm.rmsnorm_plus_one,
        norm_eps=cfg.norm_eps,
    )


class Block(nn.Module):
    def __init__(
        self, cfg: ModelConfig, n_heads: int, head_dim: int, kv_groups: list[int] | None = None, layer: int = 0
    ):
        super().__init__()
        a = cfg.attn
        layer_type = resolve_layer_types(cfg)[layer]
        self.ln_attn = make_norm(cfg) if cfg.pre_norm else nn.Identity()
        self.attn = MultiHeadAttention(
            cfg.d_model,
            n_heads,
            head_dim,
            a.combine,
            a.qkv_bias,
            a.out_bias,
            cfg.dropout,
            kv_groups,
            layer_rotary(cfg, layer_type),
            layer_features(cfg, layer_type),
            cfg.n_ctx if cfg.positions == Positions.shortformer else 0,
        )
        self.ln_attn_out = make_norm(cfg) if cfg.post_norm else None
        self.drop = nn.Dropout(cfg.dropout)
        self.ln_mlp = (make_norm(cfg) if cfg.pre_norm else nn.Identity()) if cfg.mlp else None
        self.mlp = MLP(cfg) if cfg.mlp else None
        self.ln_mlp_out = make_norm(cfg) if cfg.mlp and cfg.post_norm else None
        self.parallel_residual = cfg.parallel_residual

    def forward(
        self,
        x_BTC: Tensor,
        gate: Tensor | None = None,
        replacement: Tensor | None = None,
        cache: dict | None = None,
        need_pattern: bool = False,
        gate_where: Tensor | None = None,
    ) -> Tensor:
        """gate, replacement, cache, need_pattern and gate_where (gate_z's where) as in MultiHeadAttention."""
        z_BTHD = self.attn.heads(self.ln_attn(x_BTC), cache, need_pattern)
        gated_BTHD = self.attn.gate_z(z_BTHD, gate, replacement, gate_where)
        if cache is not None and gate is not None:
            cache["z_gated"] = gated_BTHD  # what the heads pass on: gradients at the gates read it (attribution.py)
        return self.finish(x_BTC, gated_BTHD)

    def finish(self, x_BTC: Tensor, z_BTHD: Tensor) -> Tensor:
        """The block's output given its input x and its heads' (gated) z: add the combined heads and the MLP."""
        attn_BTC = self.attn.combine_heads(z_BTHD)
        if self.ln_attn_out is not None:
            attn_BTC = self.ln_attn_out(attn_BTC)
        attn_BTC = self.drop(attn_BTC)
        if self.mlp is None:
            return x_BTC + attn_BTC
        if self.parallel_residual:
            return x_BTC + attn_BTC + self.mlp_out(x_BTC)
        x_BTC = x_BTC + attn_BTC
        return x_BTC + self.mlp_out(x_BTC)

    def mlp_out(self, x_BTC: Tensor) -> Tensor:
        out_BTC = self.mlp(self.ln_mlp(x_BTC))
        return out_BTC if self.ln_mlp_out is None else self.ln_mlp_out(out_BTC)

    def activation_floats(self, seq_len: int) -> int:
        """A generous count of the floats the block holds per position while it runs: the stream and its copies,
        the norms' outputs, and what attention and the MLP hold."""
        mlp = self.mlp.activation_floats() if self.mlp is not None else 0
        norms = 4 if self.ln_attn_out is not None else 0  # post-norms' inputs and outputs
        return (4 + norms) * self.attn.d_model + self.attn.activation_floats(seq_len) + mlp
