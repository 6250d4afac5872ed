"""One transformer layer: attention, then an optional MLP, each added to the residual stream, one after the other or,
with parallel_residual (GPT-NeoX), both read from the block's input. Each may have a norm on its input (pre_norm:
ln_attn, ln_mlp) and on its output before the addition (post_norm: ln_attn_out, ln_mlp_out; Gemma 2/3 have both, a
"sandwich", OLMo 2 only the second), or, post-LN (BERT, the original Transformer), a norm on the stream after each
addition: x <- norm(x + attn(x)), x <- norm(x + mlp(x)) (ln_attn_add, ln_mlp_add).

`Block.forward` is heads -> finish: the attention module produces z and `finish` takes the block input and that z the
rest of the way (combine heads, project, post-norm, add, MLP); with an intervention at this layer the same steps run
with its hooks at the named sites between them (head gates are a hook at attn.z). The ablation evaluator calls the
same `finish` on a cached, gated z, so the model and the evaluator share one code path, and a post-attention norm acts
after the heads combine: gating z means the same with or without it.

A layer's type (model.layer_types: full or sliding) sets its attention window and, with rotary_theta_local, its
rotary base (Gemma 3's local layers use their own base, unscaled, its global layers the scaled one).
"""

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from headcount.config.model import (
    AttentionConfig,
    LayerType,
    ModelConfig,
    Norm,
    Positions,
    RopeScalingConfig,
    resolve_head_dim,
    resolve_layer_types,
    rotary_dims,
)
from headcount.errors import ConfigError
from headcount.model.attention import AttentionFeatures, MultiHeadAttention
from headcount.model.intervention import Intervention
from headcount.model.mlp import MLP
from headcount.model.norm import make_norm
from headcount.model.rotary import Rotary
from headcount.model.sites import BLOCK_SITES, HEAD_INPUTS, KEY, OWN_HEAD_INPUTS, STACK_SITES, Site

# the sites inside attention, which a block whose heads come from elsewhere (`heads`) does not pass through
ATTENTION_INSIDE = (*HEAD_INPUTS, *OWN_HEAD_INPUTS, "attn.q", "attn.k", "attn.v", "attn.pattern")


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
        causal=cfg.causal,
    )


@dataclass
class CrossInput:
    """What one decoder layer's cross-attention reads: the encoder's output and which of its positions are real."""

    memory_BSC: Tensor
    bias: Tensor | None = None  # (B, 1, 1, S): 0 at real source positions, -inf at padding


def cross_features(cfg: ModelConfig, cross: AttentionConfig) -> AttentionFeatures:
    """Cross-attention sees every source position and has no positions of its own (no rotary, no q/k norm)."""
    scalar = cross.query_pre_attn_scalar
    return AttentionFeatures(scale=None if scalar is None else scalar**-0.5, softcap=cross.softcap, causal=False)


class Block(nn.Module):
    def __init__(
        self,
        cfg: ModelConfig,
        n_heads: int,
        head_dim: int,
        kv_groups: list[int] | None = None,
        layer: int = 0,
        cross: AttentionConfig | None = None,
        cross_groups: list[int] | None = None,
    ):
        """cross: the cross-attention heads of a decoder layer of an encoder-decoder (config/model.py
        cross_attention), or None; cross_groups: this layer's cross-attention heads as key/value groups (a pruned
        model's, config/model.py resolve_cross_groups), None: cross's n_heads and n_kv_heads."""
        super().__init__()
        self.layer = layer
        # this layer's named sites, by kind
        self.sites = {kind: Site(kind, layer) for kind in BLOCK_SITES + STACK_SITES}
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
        # post_ln: the stream itself is normalised after each addition (BERT)
        self.ln_attn_add = make_norm(cfg) if cfg.post_ln else None
        self.ln_mlp_add = make_norm(cfg) if cfg.post_ln and cfg.mlp else None
        # An encoder-decoder's decoder layer: cross-attention to the encoder's output between attention and the MLP,
        # with the same norms around it (ln_cross, ln_cross_out, ln_cross_add)
        self.cross = None
        if cross is not None:
            n_kv = cross.n_kv_heads
            groups = None if n_kv is None else [cross.n_heads // n_kv] * n_kv
            groups = groups if cross_groups is None else list(cross_groups)
            self.ln_cross = make_norm(cfg) if cfg.pre_norm else nn.Identity()
            self.cross = MultiHeadAttention(
                cfg.d_model,
                cross.n_heads if cross_groups is None else sum(cross_groups),
                resolve_head_dim(cfg.d_model, cross, "model.cross_attn"),
                cross.combine,
                cross.qkv_bias,
                cross.out_bias,
                cfg.dropout,
                groups,
                features=cross_features(cfg, cross),
            )
            self.ln_cross_out = make_norm(cfg) if cfg.post_norm else None
            self.ln_cross_add = make_norm(cfg) if cfg.post_ln else None

    def forward(
        self,
        x_BTC: Tensor,
        intervention: Intervention | None = None,
        bias: Tensor | None = None,
        cross: CrossInput | None = None,
    ) -> Tensor:
        """The block's output; with an intervention that touches this layer, its hooks and reads at the layer's named
        sites (model/sites.py; head gates are hooks at attn.z, a decoder layer's cross-attention heads' at cross.z),
        the same operations in the same order as the plain path, so hooks that change nothing give the same bits.
        bias: added to the self-attention scores (MultiHeadAttention.attend: T5's relative bias, padded keys); cross:
        what a decoder layer's cross-attention reads."""
        return self.forward_with_heads(x_BTC, intervention, bias=bias, cross=cross)

    def forward_with_heads(
        self,
        x_BTC: Tensor,
        intervention: Intervention | None = None,
        heads: Callable[[Tensor], Tensor] | None = None,
        bias: Tensor | None = None,
        cross: CrossInput | None = None,
    ) -> Tensor:
        """`forward`, with heads: z from the normed input in place of the layer's attention over the whole sequence
        (a suffix run's slots over the clean keys, model/suffix.py); the sites inside attention (q, k, v, their
        inputs, the pattern) are then not there to hook."""
        if intervention is None or not intervention.touches(self.layer):
            normed_BTC = self.ln_attn(x_BTC)
            return self.finish(x_BTC, self.attn.heads(normed_BTC, bias) if heads is None else heads(normed_BTC), cross)
        at, s = intervention.at, self.sites
        x_BTC = at(s["resid_pre"], x_BTC)
        if heads is not None:
            inside = [s[name].name for name in ATTENTION_INSIDE if intervention.wants(s[name])]
            if inside:
                raise ConfigError(KEY, inside[0], "a run over some positions (model/suffix.py) has no such site")
            z_BTHD = heads(self.ln_attn(x_BTC))
        elif any(intervention.wants(s[name]) for name in OWN_HEAD_INPUTS):
            z_BTHD = self.heads_from_own_inputs(x_BTC, intervention, s, bias)
        else:
            q_BHTD, k_BGTD, v_BGTD = self.intervened_qkv(x_BTC, intervention, s)
            pattern_hook = (lambda p: at(s["attn.pattern"], p)) if intervention.wants(s["attn.pattern"]) else None
            z_BTHD = self.attn.attend(q_BHTD, k_BGTD, v_BGTD, pattern_hook, bias)
        z_BTHD = at(s["attn.z"], z_BTHD)
        attn_BTC = self.attn.combine_heads(z_BTHD)
        if self.ln_attn_out is not None:
            attn_BTC = self.ln_attn_out(attn_BTC)
        attn_BTC = at(s["attn_out"], self.drop(attn_BTC))
        if self.mlp is None and self.cross is None:
            return at(s["resid_post"], self.add_attn(x_BTC, attn_BTC))
        mid_BTC = self.add_attn(x_BTC, attn_BTC)
        if self.cross is not None and not self.parallel_residual:
            cross_hook = (lambda z: at(s["cross.z"], z)) if intervention.wants(s["cross.z"]) else None
            mid_BTC = self.add_cross(mid_BTC, cross, cross_hook)
        if self.mlp is None:
            return at(s["resid_post"], mid_BTC)
        hidden_hook = (lambda h: at(s["mlp.hidden"], h)) if intervention.wants(s["mlp.hidden"]) else None
        read_BTC = at(s["mlp.input"], x_BTC if self.parallel_residual else mid_BTC)  # the MLP's alone
        mlp_BTC = self.mlp(at(s["mlp_in"], self.ln_mlp(read_BTC)), hidden_hook)
        mlp_BTC = at(s["mlp_out"], mlp_BTC if self.ln_mlp_out is None else self.ln_mlp_out(mlp_BTC))
        # finish's order of additions: (x + attn) + mlp in both residual forms
        return at(s["resid_post"], self.add_mlp(mid_BTC, mlp_BTC))

    def intervened_qkv(self, x_BTC: Tensor, intervention: Intervention, s: dict) -> tuple[Tensor, Tensor, Tensor]:
        """q (B, H, T, D), k and v (B, G, T, D) with the hooks at the heads' inputs and at q, k, v. Hooks at the
        inputs give every head an input of its own: the heads then project them one by one (project_inputs, the
        key/value heads from the inputs of their group, k_input[:, :, g])."""
        attn, at = self.attn, intervention.at
        if any(intervention.wants(s[name]) for name in HEAD_INPUTS):
            B, T, C = x_BTC.shape
            q_BTHC = at(s["attn.q_input"], x_BTC[:, :, None].expand(B, T, attn.n_heads, C).contiguous())
            k_BTGC = at(s["attn.k_input"], x_BTC[:, :, None].expand(B, T, attn.n_kv_heads, C).contiguous())
            v_BTGC = at(s["attn.v_input"], x_BTC[:, :, None].expand(B, T, attn.n_kv_heads, C).contiguous())
            kv_H = attn.kv_head_of
            x_BTHWC = torch.stack([q_BTHC, k_BTGC.index_select(2, kv_H), v_BTGC.index_select(2, kv_H)], dim=3)
            q_BHTD, k_BHTD, v_BHTD = attn.project_inputs(self.ln_attn(x_BTHWC.permute(0, 2, 3, 1, 4)))
            first_G = attn.first_query_heads
            k_BGTD, v_BGTD = k_BHTD.index_select(1, first_G), v_BHTD.index_select(1, first_G)
        else:
            q_BHTD, k_BGTD, v_BGTD = attn.project(self.ln_attn(x_BTC))
        for name in ("attn.q", "attn.k", "attn.v"):
            if intervention.wants(s[name]):  # sites are (B, T, heads, D), as z is
                edited = at(s[name], {"attn.q": q_BHTD, "attn.k": k_BGTD, "attn.v": v_BGTD}[name].transpose(1, 2))
                q_BHTD, k_BGTD, v_BGTD = (
                    edited.transpose(1, 2) if name == n else t
                    for n, t in (("attn.q", q_BHTD), ("attn.k", k_BGTD), ("attn.v", v_BGTD))
                )
        return q_BHTD, k_BGTD, v_BGTD

    def heads_from_own_inputs(
        self, x_BTC: Tensor, intervention: Intervention, s: dict, bias: Tensor | None = None
    ) -> Tensor:
        """z (B, T, H, D) of the heads each reading q, k, v from inputs of its own (the sites attn.qkv_input, before
        the layer's input norm, and attn.qkv_normed, after it; (B, H, 3, T, C)), projected per query head
        (MultiHeadAttention.heads_from_inputs). Without a hook at attn.qkv_input the norm runs once, on the stream,
        and attn.qkv_normed holds its 3H copies: EAP's gradient taps read there, and the gradient at a copy taken back
        through the norm (`input_norm_vjp`) is the gradient at that head's input, without normalising 3H inputs."""
        at, H = intervention.at, self.attn.n_heads
        if any(intervention.wants(s[name]) for name in HEAD_INPUTS):
            raise ConfigError(KEY, s["attn.qkv_input"].name, "a layer takes per-head inputs at q|k|v_input or here")
        if intervention.wants(s["attn.qkv_input"]):
            x_BHWTC = at(s["attn.qkv_input"], x_BTC.expand(H, 3, *x_BTC.shape).permute(2, 0, 1, 3, 4))
            normed_BHWTC = at(s["attn.qkv_normed"], self.ln_attn(x_BHWTC))
        else:  # the copies laid out (H, 3, B, T, C), as the gradient run has always taken them
            normed_BTC = self.ln_attn(x_BTC)
            copies_BHWTC = normed_BTC.expand(H, 3, *normed_BTC.shape).contiguous().permute(2, 0, 1, 3, 4)
            normed_BHWTC = at(s["attn.qkv_normed"], copies_BHWTC)
        return self.attn.heads_from_inputs(normed_BHWTC, bias=bias)

    def input_norm_vjp(self, at_BTC: Tensor, grads_HWBTC: Tensor) -> Tensor:
        """(H, 3, B, T, C): each gradient at a copy of the layer's normed input (attn.qkv_normed's, head first) taken
        back through its input norm at `at`, J^T g, all 3H at once (one linearisation, mapped over the copies)."""
        return norm_vjp(self.ln_attn, at_BTC, grads_HWBTC)

    def heads_from_inputs(
        self, x_BKWTC: Tensor, heads_K: Tensor | None = None, queries: tuple[Tensor, Tensor] | None = None
    ) -> Tensor:
        """z (B, T, K, D) of K heads each reading q, k, v from its own inputs x[:, k, 0|1|2] (B, K, 3, T, C), the
        stream before the layer's input norm (MultiHeadAttention.project_inputs after the norm); queries as in
        MultiHeadAttention.heads_from_inputs."""
        return self.attn.heads_from_inputs(self.ln_attn(x_BKWTC), heads_K, queries)

    @property
    def mlp_reads_attention(self) -> bool:
        """Whether the MLP reads this layer's attention output (not in a parallel-residual block)."""
        return not self.parallel_residual

    @property
    def attention_post_norm(self) -> bool:
        """Whether attention's output is normalised before it joins the stream (Gemma 2/3, OLMo 2): then the stream is
        no sum of per-head terms."""
        return self.ln_attn_out is not None

    def head_terms(self, z_BTHD: Tensor, layout: str = "bthc") -> Tensor:
        """Each head's term z_h W_O^h before the heads add up (no bias, no post-norm), in `layout` (an einsum output
        of b, t, h, c: "bthc" (B, T, H, C), "hbtc" (H, B, T, C)); "btc" sums them."""
        return torch.einsum(f"bthd,hdc->{layout}", z_BTHD, self.attn.W_O)

    def head_terms_of(self, z_BTKD: Tensor, heads: list[int]) -> Tensor:
        """(B, T, C): sum over the chosen heads (K of them, z in their order) of z_h W_O^h."""
        return torch.einsum("bthd,hdc->btc", z_BTKD, self.attn.W_O[heads])

    def attention_mix(self, z_BTHD: Tensor, dz_BTHD: Tensor | None, w_BXH: Tensor | None) -> Tensor:
        """(B, X, T, C): attention's output as it joins the stream, post_norm(combine(z + w dz)), for X mixes of the
        heads' outputs, head h's z moved by w[:, x, h] dz_h (w None: z itself, X = 1). Without a post-norm it is linear
        in z: combine(z) once plus each mix's sum_h w_h dz_h W_O^h, which saves combining X copies."""
        if w_BXH is not None and self.ln_attn_out is None:
            mixed_BXTC = torch.einsum("bxh,bthc->bxtc", w_BXH, self.head_terms(dz_BTHD))
            return self.drop(self.attn.combine_heads(z_BTHD))[:, None] + mixed_BXTC
        mixed_BXTHD = z_BTHD[:, None]
        if w_BXH is not None:
            mixed_BXTHD = mixed_BXTHD + w_BXH[:, :, None, :, None] * dz_BTHD[:, None]
        B, X = mixed_BXTHD.shape[:2]
        out_NTC = self.attn.combine_heads(mixed_BXTHD.flatten(0, 1))
        if self.ln_attn_out is not None:
            out_NTC = self.ln_attn_out(out_NTC)
        out_NTC = self.drop(out_NTC)
        return out_NTC.view(B, X, *out_NTC.shape[1:])

    def combined_attention(self, z_BTHD: Tensor) -> Tensor:
        """(B, T, C): the heads combined, before a post-norm (where the stream reads attention through one)."""
        return self.attn.combine_heads(z_BTHD)

    def attention_post_norm_vjp(self, at_BTC: Tensor, grads_XBTC: Tensor) -> Tensor:
        """(X, B, T, C): J^T g for each of the X gradients g, J the Jacobian of attention's post-norm at its input `at`
        (row by row)."""
        at_XBTC = at_BTC.detach().expand_as(grads_XBTC).contiguous().requires_grad_()
        with torch.enable_grad():
            (vjp,) = torch.autograd.grad(self.ln_attn_out(at_XBTC), at_XBTC, grads_XBTC)
        return vjp

    def finish(self, x_BTC: Tensor, z_BTHD: Tensor, cross: CrossInput | None = None) -> Tensor:
        """The block's output given its input x and its heads' (gated) z: add the combined heads, then (a decoder
        layer of an encoder-decoder) the cross-attention to cross's memory, then the MLP."""
        attn_BTC = self.attn.combine_heads(z_BTHD)
        if self.ln_attn_out is not None:
            attn_BTC = self.ln_attn_out(attn_BTC)
        attn_BTC = self.drop(attn_BTC)
        if self.mlp is None and self.cross is None:
            return self.add_attn(x_BTC, attn_BTC)
        if self.parallel_residual:
            return x_BTC + attn_BTC + self.mlp_out(x_BTC)
        x_BTC = self.add_attn(x_BTC, attn_BTC)
        if self.cross is not None:
            x_BTC = self.add_cross(x_BTC, cross)
        return x_BTC if self.mlp is None else self.add_mlp(x_BTC, self.mlp_out(x_BTC))

    def add_cross(
        self, x_BTC: Tensor, cross: CrossInput | None, z_hook: Callable[[Tensor], Tensor] | None = None
    ) -> Tensor:
        """The stream after cross-attention: x + combine(z), z_h = softmax(q_h k_h^T * s + padding) v_h with q from
        norm(x) and k, v from the memory, z after z_hook (the intervention at cross.z: its head gates); normalised
        after the addition in a post-LN block."""
        if cross is None:
            raise ValueError("a decoder layer with cross-attention needs the encoder's output (memory)")
        z_BTHD = self.cross.attend(*self.cross.project_cross(self.ln_cross(x_BTC), cross.memory_BSC), bias=cross.bias)
        if z_hook is not None:
            z_BTHD = z_hook(z_BTHD)
        out_BTC = self.cross.combine_heads(z_BTHD)
        if self.ln_cross_out is not None:
            out_BTC = self.ln_cross_out(out_BTC)
        return self.add_cross_out(x_BTC, self.drop(out_BTC))

    def add_cross_out(self, x_BTC: Tensor, cross_BTC: Tensor) -> Tensor:
        """The stream after cross-attention's output (as it joins the stream) is added: x + cross, normalised after
        the addition in a post-LN block."""
        return x_BTC + cross_BTC if self.ln_cross_add is None else self.ln_cross_add(x_BTC + cross_BTC)

    def cross_from_inputs(self, q_BKTC: Tensor, memory_BKWSC: Tensor) -> Tensor:
        """z (B, T, K, D) of the layer's K cross-attention heads (all of them), head k reading its query from its
        own input q[:, k] (the decoder's stream, before the cross-attention's input norm) and its keys and values
        from its own copies of the encoder's output memory[:, k, 0|1] (B, K, 2, S, C), after the encoder's final
        norm (MultiHeadAttention.cross_heads_from_inputs). With every input the plain one this is add_cross's z."""
        return self.cross.cross_heads_from_inputs(self.ln_cross(q_BKTC), memory_BKWSC)

    def cross_mix(self, z_BTHD: Tensor, dz_BTHD: Tensor | None, w_BXH: Tensor | None) -> Tensor:
        """(B, X, T, C): cross-attention's output as it joins the stream, post_norm(combine(z + w dz)), for X mixes
        of the cross heads' outputs (attention_mix's definition for the cross-attention heads; w None: z itself)."""
        mixed_BXTHD = z_BTHD[:, None]
        if w_BXH is not None:
            mixed_BXTHD = mixed_BXTHD + w_BXH[:, :, None, :, None] * dz_BTHD[:, None]
        B, X = mixed_BXTHD.shape[:2]
        out_NTC = self.cross.combine_heads(mixed_BXTHD.flatten(0, 1))
        if self.ln_cross_out is not None:
            out_NTC = self.ln_cross_out(out_NTC)
        out_NTC = self.drop(out_NTC)
        return out_NTC.view(B, X, *out_NTC.shape[1:])

    @property
    def post_ln(self) -> bool:
        """Whether the stream is normalised after an addition (BERT's post-LN block): then it is no sum of outputs."""
        return self.ln_attn_add is not None or self.ln_mlp_add is not None

    def sums_head_terms(self, grad: bool = False) -> bool:
        """Whether attention joins the stream as a plain sum of per-head terms z_h W_O^h (plus the bias) that later
        additions leave a sum: no post-norm on attention's output, no norm after an addition (post-LN), and, where
        gradients are on (grad), none asked of W_O (the circuits core's matmul mix gives none)."""
        frozen = not (grad and self.attn.out.weight.requires_grad)
        return self.ln_attn_out is None and not self.post_ln and frozen

    def add_attn(self, x_BTC: Tensor, attn_BTC: Tensor) -> Tensor:
        """The stream after attention: x + attn, normalised after the addition in a post-LN block."""
        return x_BTC + attn_BTC if self.ln_attn_add is None else self.ln_attn_add(x_BTC + attn_BTC)

    def add_mlp(self, x_BTC: Tensor, mlp_BTC: Tensor) -> Tensor:
        return x_BTC + mlp_BTC if self.ln_mlp_add is None else self.ln_mlp_add(x_BTC + mlp_BTC)

    def mlp_out(self, x_BTC: Tensor) -> Tensor:
        out_BTC = self.mlp(self.ln_mlp(x_BTC))
        return out_BTC if self.ln_mlp_out is None else self.ln_mlp_out(out_BTC)

    def activation_floats(self, seq_len: int) -> int:
        """A generous count of the floats the block holds per position while it runs: the stream and its copies,
        the norms' outputs, and what attention and the MLP hold."""
        mlp = self.mlp.activation_floats() if self.mlp is not None else 0
        norms = 4 if self.ln_attn_out is not None else 0  # post-norms' inputs and outputs
        return (4 + norms) * self.attn.d_model + self.attn.activation_floats(seq_len) + mlp


def norm_vjp(norm: nn.Module, at_BTC: Tensor, grads_XYBTC: Tensor) -> Tensor:
    """(X, Y, B, T, C): each gradient taken back through `norm` at `at`, J^T g, all X * Y at once (one linearisation,
    mapped over the gradients)."""
    _, vjp = torch.func.vjp(norm, at_BTC)
    return torch.vmap(vjp)(grads_XYBTC.flatten(0, 1))[0].view_as(grads_XYBTC)
