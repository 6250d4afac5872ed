"""A decoder-only transformer whose attention heads can be gated, replaced, counted and removed.

Blocks (model/block.py; LayerNorm or RMSNorm, pre-, post- or sandwich norms, sequential or parallel residual), learned
or rotary positions (scaled or not), optional MLP (attention-only models are `mlp: false`; GELU, SwiGLU or GeGLU),
embeddings scaled by sqrt(d_model) or not, tied or untied unembedding, soft-capped logits or not: GPT-2, Llama,
GPT-NeoX, Mistral, Qwen2/3, Gemma 1/2/3, OLMo 2 and Phi-3 are settings of one model (config/model.py), and
headcount.pretrained converts their checkpoints into it.
The forward pass is split in three (`embed`, `forward_layers`, `unembed`): `forward_layers(resid, start)` starts at
any layer from the residual stream before it, which the ablation evaluator uses to reuse the stream before the first
layer a mask touches. `select_heads` is structural pruning: a smaller
Transformer, equal to the masked one, built layer by layer by MultiHeadAttention.select_heads.
"""

import copy
import math
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from headcount.config.model import (
    AttentionConfig,
    ModelConfig,
    Positions,
    embed_width,
    resolve_head_dim,
    resolve_kv_groups,
    validate_model_config,
)
from headcount.errors import ConfigError
from headcount.model.block import Block, CrossInput
from headcount.model.intervention import Intervention
from headcount.model.mlm import MaskedLMTransform
from headcount.model.norm import make_norm
from headcount.model.relative import RelativePositionBias
from headcount.model.sites import Site

EMBED, FINAL_NORM, LOGITS = Site("embed"), Site("final_norm"), Site("logits")


class Unembedding(nn.Linear):
    """The unembedding, bias-free, its logits soft-capped to cap * tanh(logits / cap) when softcap is set (Gemma 2).
    Its weight is `lm_head.weight` either way, so checkpoints keep their names; a masked-LM head adds a bias
    (`lm_head.bias`)."""

    def __init__(self, d_model: int, vocab_size: int, softcap: float | None = None, bias: bool = False):
        super().__init__(d_model, vocab_size, bias=bias)
        self.softcap = softcap

    def forward(self, x: Tensor) -> Tensor:
        logits = super().forward(x)
        return logits if self.softcap is None else torch.tanh(logits / self.softcap) * self.softcap


@dataclass(frozen=True)
class ActivationFloats:
    """Floats per position a pass holds, for memory budgets: generous counts, not measurements."""

    resid: int  # the residual stream
    z: int  # the widest layer's z
    layer: int  # what the widest layer holds while it runs
    logits: int  # the unembedding's output


@dataclass
class Memory:
    """What a decoder stack's cross-attention reads (model/encoder_decoder.py): the encoder's output and which source
    positions are real (its heads' gates are an intervention's, `Gates` at the cross.z sites)."""

    states_BSC: Tensor
    keep_BS: Tensor | None = None  # bool, False at padding; None: every position is real


def key_padding_bias(keep_BS: Tensor, dtype: torch.dtype) -> Tensor:
    """(B, 1, 1, S): 0 where a key is real, -inf at padding (added to the scores)."""
    zeros_BS = torch.zeros(keep_BS.shape, dtype=dtype, device=keep_BS.device)
    return zeros_BS.masked_fill(~keep_BS.bool(), float("-inf"))[:, None, None, :]


def sinusoid(T: int, width: int, device: torch.device) -> Tensor:
    """(T, width) float64: PE(t, 2i) = sin(t / 10000^(2i / width)), PE(t, 2i + 1) = cos(the same angle)."""
    pos_T1 = torch.arange(T, dtype=torch.float64, device=device)[:, None]
    angle_TW = pos_T1 / 10000 ** (2 * (torch.arange(width, device=device) // 2) / width).to(torch.float64)
    return torch.where(torch.arange(width, device=device) % 2 == 0, angle_TW.sin(), angle_TW.cos())


class Transformer(nn.Module):
    def __init__(
        self,
        cfg: ModelConfig,
        cross: AttentionConfig | None = None,
        unembedding: bool = True,
        cross_groups: list[list[int]] | None = None,
    ):
        """A one-stack model (decoder-only or encoder), or one stack of an encoder-decoder (EncoderDecoder builds
        them): cross, the cross-attention heads of a decoder stack's layers, cross_groups their key/value groups per
        layer (a pruned model's; None: cross's in every layer); unembedding false for an encoder stack, which has no
        logits."""
        super().__init__()
        validate_model_config(cfg)
        if cfg.encoder_layers:
            allowed = "is an encoder-decoder: build it with headcount.model.build_model (an EncoderDecoder)"
            raise ConfigError("model.encoder_layers", cfg.encoder_layers, allowed)
        self.cfg = cfg
        self.head_dim = resolve_head_dim(cfg.d_model, cfg.attn)
        self.heads_per_layer = list(cfg.heads_per_layer or [cfg.attn.n_heads] * cfg.n_layers)
        kv_groups = resolve_kv_groups(cfg)
        width = embed_width(cfg)
        self.tok_emb = nn.Embedding(cfg.vocab_size, width)
        learned = cfg.positions == Positions.learned
        self.pos_emb = nn.Embedding(cfg.n_ctx + cfg.position_offset, width) if learned else None
        self.type_emb = nn.Embedding(cfg.type_vocab_size, width) if cfg.type_vocab_size else None
        self.ln_emb = make_norm(cfg, width) if cfg.embed_norm else None
        self.emb_proj = nn.Linear(width, cfg.d_model) if width != cfg.d_model else None
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(
            Block(cfg, h, self.head_dim, g, layer, cross, None if cross_groups is None else cross_groups[layer])
            for layer, (h, g) in enumerate(zip(self.heads_per_layer, kv_groups))
        )
        relative = cfg.positions == Positions.relative
        buckets, distance = cfg.relative_buckets, cfg.relative_max_distance
        self.rel_bias = RelativePositionBias(cfg.attn.n_heads, buckets, distance, not cfg.causal) if relative else None
        self.ln_f = make_norm(cfg) if cfg.final_norm else nn.Identity()
        self.mlm = MaskedLMTransform(cfg) if cfg.mlm_head else None
        head_width = width if cfg.mlm_head else cfg.d_model
        logits_bias = cfg.mlm_head or cfg.logits_bias
        self.lm_head = Unembedding(head_width, cfg.vocab_size, cfg.final_softcap, logits_bias) if unembedding else None
        if cfg.tie_embeddings and unembedding:
            self.lm_head.weight = self.tok_emb.weight
        self.apply(self._init_weights)
        # GPT-2: scale the projections that write into the residual stream by the depth.
        for name, p in self.named_parameters():
            if name.endswith(("attn.out.weight", "mlp.proj.weight")):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * cfg.n_layers))

    def tie_weights(self) -> None:
        """The unembedding reads the token embedding's tensor again (after a load that assigned tensors)."""
        if self.cfg.tie_embeddings and self.lm_head is not None:
            self.lm_head.weight = self.tok_emb.weight

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    @property
    def n_layers(self) -> int:
        return len(self.blocks)

    @property
    def max_heads(self) -> int:
        # At least 1, so gate tensors stay well-formed even when pruning removed every head.
        return max(max(self.heads_per_layer), 1)

    def forward(
        self, idx_BT: Tensor, intervention: Intervention | None = None, token_types: Tensor | None = None
    ) -> Tensor:
        """Logits (B, T, vocab).

        intervention: hooks and reads at named sites (model/intervention.py, model/sites.py), the forward's one way
        in: head gates and mode replacements are `Gates` at the attn.z sites (`gated(gates, replacements)`), what a
        caller keeps (the stream into a layer, z, the patterns) the cache of `reads(...)`; None: the plain model.
        token_types: (B, T) segment ids when the model has token types (model.type_vocab_size); None: all 0."""
        resid_BTC = self.embed(idx_BT, token_types)
        if intervention is not None and intervention.touches(None):
            resid_BTC = intervention.at(EMBED, resid_BTC)
        final_BTC = self.forward_layers(resid_BTC, 0, intervention)
        if intervention is None or not intervention.touches(None):
            return self.unembed(final_BTC)
        normed_BTC = intervention.at(FINAL_NORM, self.ln_f(final_BTC))
        return intervention.at(LOGITS, self.lm_head(self.readout(normed_BTC)))

    def embed(self, idx_BT: Tensor, token_types: Tensor | None = None) -> Tensor:
        """The stream into layer 0: token embeddings (scaled), plus learned or sinusoidal positions and token types,
        then the embedding norm and the projection to d_model where the model has them."""
        T = idx_BT.shape[1]
        if T > self.cfg.n_ctx:
            raise ConfigError("data.seq_len", T, f"must be at most model.n_ctx={self.cfg.n_ctx}")
        tok_BTC = self.tok_emb(idx_BT)
        if self.cfg.embed_scale:  # sqrt(d_model) rounded to the model's dtype, as Gemma's code does
            tok_BTC = tok_BTC * torch.tensor(math.sqrt(self.cfg.d_model), dtype=torch.float64).to(tok_BTC.dtype)
        if self.type_emb is not None:
            types_BT = torch.zeros_like(idx_BT) if token_types is None else token_types
            tok_BTC = tok_BTC + self.type_emb(types_BT)
        elif token_types is not None:
            raise ConfigError("token_types", tuple(token_types.shape), "need model.type_vocab_size > 0")
        if self.pos_emb is not None:
            tok_BTC = tok_BTC + self.pos_emb(torch.arange(T, device=idx_BT.device) + self.cfg.position_offset)
        elif self.cfg.positions == Positions.sinusoidal:
            tok_BTC = tok_BTC + sinusoid(T, tok_BTC.shape[-1], idx_BT.device).to(tok_BTC.dtype)
        if self.ln_emb is not None:
            tok_BTC = self.ln_emb(tok_BTC)
        if self.emb_proj is not None:
            tok_BTC = self.emb_proj(tok_BTC)
        return self.drop(tok_BTC)  # rotary and shortformer positions enter in every layer's attention

    def forward_layers(
        self,
        resid_BTC: Tensor,
        start: int = 0,
        intervention: Intervention | None = None,
        keep_BT: Tensor | None = None,
        memory: "Memory | None" = None,
    ) -> Tensor:
        """The stream after the last layer, starting at layer `start` from the stream before it, resid (B, T, C):
        runs blocks start..L-1, with the intervention as in forward (its sites name layers absolutely). The stack
        options of an encoder-decoder's stacks (model/encoder_decoder.py): keep_BT, bool, False at padded keys of the
        self-attention (an encoder's padded source); memory, what a decoder stack's cross-attention reads."""
        if intervention is not None:
            intervention.check(self, resid_BTC.shape[0])
        bias = self.self_attention_bias(resid_BTC, keep_BT)
        cross = None if memory is None else self.cross_input(memory, resid_BTC.dtype)
        for block in self.blocks[start:]:
            resid_BTC = block(resid_BTC, intervention, bias, cross)
        return resid_BTC

    def self_attention_bias(self, resid_BTC: Tensor, keep_BT: Tensor | None) -> Tensor | None:
        """What every layer adds to its self-attention scores: the relative position bias (1, H, T, T) and -inf at
        padded keys (B, 1, 1, T); None without either."""
        T = resid_BTC.shape[1]
        bias = None if self.rel_bias is None else self.rel_bias(T).to(resid_BTC.dtype)
        if keep_BT is not None:
            padding = key_padding_bias(keep_BT, resid_BTC.dtype)
            bias = padding if bias is None else bias + padding
        return bias

    def cross_input(self, memory: "Memory", dtype: torch.dtype) -> CrossInput:
        """What every decoder layer's cross-attention reads: the memory and -inf at its padded positions."""
        if self.cross_heads is None:
            raise ConfigError("memory", "given", "this stack has no cross-attention (model.encoder_layers=0)")
        bias = None if memory.keep_BS is None else key_padding_bias(memory.keep_BS, dtype)
        return CrossInput(memory.states_BSC, bias)

    @property
    def cross_heads(self) -> int | None:
        """A decoder stack's most cross-attention heads in a layer (at least 1, as max_heads); None without them."""
        cross = self.blocks[0].cross if self.n_layers else None
        return None if cross is None else max(max(block.cross.n_heads for block in self.blocks), 1)

    def unembed(self, resid_BTC: Tensor) -> Tensor:
        return self.lm_head(self.readout(self.ln_f(resid_BTC)))

    def readout(self, normed_BTC: Tensor) -> Tensor:
        """What the unembedding reads from the final norm's output: it scaled by d_model^(-1/2) (T5 v1.0's tied
        unembedding, unembed_scale) or through the masked-LM transform, or it as it is."""
        if self.cfg.unembed_scale:
            normed_BTC = normed_BTC * self.cfg.d_model**-0.5
        return normed_BTC if self.mlm is None else self.mlm(normed_BTC)

    def select_heads(self, keep_LH: Tensor, replacements: list[Tensor | None] | None = None) -> "Transformer":
        """A new, smaller Transformer with only the heads keep_LH (bool, (L, max_heads)) marks, equal to this one with
        the others gated to 0, in the same dtype, device and train/eval mode; its config records heads_per_layer
        and, for a grouped-query model, the key/value groups left (kv_groups_per_layer).
        replacements: None (zero ablation) or one entry per layer, None or a constant per head (H_l, D) that folds
        into the output bias."""
        keeps = [keep_LH[layer, :n].cpu() for layer, n in enumerate(self.heads_per_layer)]
        replacements = replacements or [None] * self.n_layers
        cfg = copy.deepcopy(self.cfg)
        # One out_bias setting covers every layer: if any layer folds a replacement into its bias, all get one.
        folds = any(r is not None and not keep_H.all() for keep_H, r in zip(keeps, replacements))
        cfg.attn.out_bias = cfg.attn.out_bias or folds
        state, kept_groups = self.state_dict(), []
        for layer, (keep_H, r) in enumerate(zip(keeps, replacements)):
            attn = self.blocks[layer].attn.select_heads(keep_H, r, add_out_bias=cfg.attn.out_bias)
            kept_groups.append(attn.kv_groups)
            state.update({f"blocks.{layer}.attn.{name}": t for name, t in attn.state_dict().items()})
        cfg.heads_per_layer = [int(keep_H.sum()) for keep_H in keeps]
        if cfg.attn.n_kv_heads is not None or cfg.kv_groups_per_layer is not None:
            cfg.kv_groups_per_layer = kept_groups
        param = next(self.parameters())
        # Building the new model draws random init values that the state overwrites; keep the caller's random stream.
        with torch.random.fork_rng(devices=[]):
            selected = Transformer(cfg).to(device=param.device, dtype=param.dtype)
        selected.load_state_dict(state)
        return selected.train(self.training)

    def activation_floats(self, seq_len: int) -> ActivationFloats:
        """What a pass over seq_len positions holds per position (the evaluator's memory budget reads these)."""
        return ActivationFloats(
            resid=self.cfg.d_model,
            z=max(block.attn.z_floats() for block in self.blocks),
            layer=max(block.activation_floats(seq_len) for block in self.blocks),
            logits=self.cfg.vocab_size,
        )

    def num_params(self, non_embedding: bool = False) -> int:
        n = sum(p.numel() for p in self.parameters())
        if non_embedding:
            # pos_emb: the model's, or each layer's (shortformer)
            embeddings = ("tok_emb.weight", "pos_emb.weight", "type_emb.weight")
            n -= sum(p.numel() for name, p in self.named_parameters() if name.endswith(embeddings))
            if not self.cfg.tie_embeddings and self.lm_head is not None:
                n -= self.lm_head.weight.numel()
        return n

    def flops_per_token(self, seq_len: int | None = None, backward: bool = True) -> float:
        """Matmul FLOPs per token (PaLM appendix B): 2 per weight on the forward pass, plus the attention scores and
        weighted sums, which scale with the total head width rather than d_model; backward costs twice the forward."""
        T = seq_len or self.cfg.n_ctx
        weights = self.num_params(non_embedding=True) + self.lm_head.weight.numel()
        attention = sum(2 * 2 * h * self.head_dim * T for h in self.heads_per_layer)  # q k^T and pattern v
        forward = 2 * weights + attention
        return 3 * forward if backward else forward
