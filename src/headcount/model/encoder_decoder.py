"""An encoder-decoder: a bidirectional encoder stack and a causal decoder stack whose layers also attend to the
encoder's output (cross-attention), one token embedding shared by both (docs/DESIGN.md, "Encoder-decoders").

Each stack is a `Transformer` built from the model config (model.encoder_layers > 0): the encoder's with n_layers =
encoder_layers and causal=false and no unembedding, the decoder's with n_layers layers whose blocks carry
cross-attention heads (model.cross_attn, or model.attn's settings). Every other key (norms, positions, MLP, post-LN,
embedding scale and norm) applies to both stacks; with positions=relative each stack has its own T5 bias table,
bidirectional in the encoder and causal in the decoder. The encoder's output passes its final norm (ln_f, when
model.final_norm) before the decoder reads it.

Heads come in three kinds (labels.py): `enc`, `dec` and `cross`. Gates are a dict by kind, each (L, H) or (B, L, H)
as for a one-stack model (L the kind's stack's layers, H its heads); a kind left out is not gated. Zero ablation of
head h of a kind is that head's z set to 0 before its output projection, as everywhere (attention.py).
"""

import copy
import dataclasses
from collections.abc import Iterable

import torch
from torch import Tensor, nn

from headcount.config.model import (
    ENCODER_DECODER_HEADS,
    ModelConfig,
    cross_attention,
    resolve_cross_groups,
    validate_model_config,
)
from headcount.errors import ConfigError
from headcount.labels import HEAD_KINDS, KIND_NAMES, KindRows, kind_head_label, parse_kind_head
from headcount.model.attention import MultiHeadAttention
from headcount.model.intervention import Gates as GateHook
from headcount.model.intervention import Hook, Intervention, reads
from headcount.model.sites import Site, parse_stack_site
from headcount.model.transformer import EMBED, FINAL_NORM, LOGITS, Memory, Transformer

Gates = dict[str, Tensor]
ENC_OUT = Site("out")  # the encoder's output after its final norm, enc.out


class StackIntervention:
    """An encoder-decoder's intervention at its stack-prefixed site names (model/sites.py: enc.blocks.1.attn.z,
    dec.blocks.0.cross.z, enc.out): hooks and reads split into one `Intervention` per stack, which that stack's
    forward runs; its hooks see, its errors and its cache name, each site with its stack."""

    def __init__(self, hooks: Iterable[tuple[str, Hook]] = (), cache: Iterable[str] = ()):
        split_hooks: dict[str, list] = {"enc": [], "dec": []}
        split_cache: dict[str, list] = {"enc": [], "dec": []}
        for name, fn in hooks:
            stack, site = parse_stack_site(name)
            split_hooks[stack].append((site, fn))
        for name in cache:
            stack, site = parse_stack_site(name)
            split_cache[stack].append(site)
        self.enc = Intervention(split_hooks["enc"], split_cache["enc"], stack="enc")
        self.dec = Intervention(split_hooks["dec"], split_cache["dec"], stack="dec")

    @property
    def cache(self) -> dict[str, Tensor]:
        return {**self.enc.cache, **self.dec.cache}


def stack_configs(cfg: ModelConfig) -> tuple[ModelConfig, ModelConfig]:
    """The encoder's and the decoder's one-stack configs."""
    common = dataclasses.replace(cfg, encoder_layers=0, cross_attn=None, **{key: None for key in ENCODER_DECODER_HEADS})
    unembedding_keys = {"tie_embeddings": False, "unembed_scale": False, "logits_bias": False, "final_softcap": None}
    encoder_heads = {
        "heads_per_layer": cfg.encoder_heads_per_layer,
        "kv_groups_per_layer": cfg.encoder_kv_groups_per_layer,
    }
    encoder = dataclasses.replace(
        common, n_layers=cfg.encoder_layers, causal=False, **unembedding_keys, **encoder_heads
    )
    return encoder, common


class EncoderDecoder(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        validate_model_config(cfg)
        if not cfg.encoder_layers:
            raise ConfigError("model.encoder_layers", cfg.encoder_layers, "must be above 0 for an encoder-decoder")
        self.cfg = cfg
        encoder_cfg, decoder_cfg = stack_configs(cfg)
        self.encoder = Transformer(encoder_cfg, unembedding=False)
        self.decoder = Transformer(decoder_cfg, cross=cross_attention(cfg), cross_groups=resolve_cross_groups(cfg))
        self.encoder.tok_emb = self.decoder.tok_emb  # one token embedding (T5's and BART's `shared`)

    def tie_weights(self) -> None:
        """One token embedding again (and the tied unembedding), after a load that assigned tensors."""
        self.encoder.tok_emb = self.decoder.tok_emb
        self.decoder.tie_weights()

    @property
    def head_kinds(self) -> dict[str, tuple[int, int]]:
        """Each kind's (layers, heads): the shape of its gates (heads: the most in a layer, at least 1)."""
        return {
            "enc": (self.encoder.n_layers, self.encoder.max_heads),
            "dec": (self.decoder.n_layers, self.decoder.max_heads),
            "cross": (self.decoder.n_layers, self.decoder.cross_heads),
        }

    @property
    def kind_heads_per_layer(self) -> dict[str, list[int]]:
        """Each kind's heads in every layer (a structurally pruned model's differ by layer)."""
        return {
            "enc": list(self.encoder.heads_per_layer),
            "dec": list(self.decoder.heads_per_layer),
            "cross": [block.cross.n_heads for block in self.decoder.blocks],
        }

    @property
    def heads_per_layer(self) -> KindRows:
        """Every head as one grid, the scans' view (labels.KindRows): rows the encoder's layers, the decoder's, then
        its cross-attention layers."""
        return KindRows(self.head_kinds, self.kind_heads_per_layer)

    def attention(self, kind: str, layer: int) -> "MultiHeadAttention":
        """A kind's attention module in a layer: the encoder's or the decoder's self-attention, or cross-attention."""
        stack = self.encoder if kind == "enc" else self.decoder
        return stack.blocks[layer].cross if kind == "cross" else stack.blocks[layer].attn

    def select_heads(self, keep: Gates, replacements: dict[str, list[Tensor | None]] | None = None) -> "EncoderDecoder":
        """A new, smaller EncoderDecoder with only the heads `keep` marks (a dict by kind, each bool (L, H) as the
        kind's gates; a kind left out keeps every head), equal to this one with the others gated to 0, in the same
        dtype, device and train/eval mode (Transformer.select_heads, per kind). replacements: a dict by kind, each
        None or a constant per head (H_l, D) per layer, folded into the output bias. Its config records each kind's
        heads per layer (heads_per_layer, encoder_heads_per_layer, cross_heads_per_layer) and, under grouped-query
        attention, the key/value groups left, so that its checkpoint rebuilds."""
        keep, replacements = self.check_kinds(keep, "keep"), self.check_kinds(replacements, "replacements")
        counts = self.kind_heads_per_layer
        keeps = {
            kind: [
                keep[kind][layer, :n].bool().cpu() if kind in keep else torch.ones(n, dtype=torch.bool)
                for layer, n in enumerate(counts[kind])
            ]
            for kind in HEAD_KINDS
        }
        constants = {kind: list(replacements.get(kind) or [None] * len(counts[kind])) for kind in HEAD_KINDS}
        folds = {
            kind: any(r is not None and not k.all() for k, r in zip(keeps[kind], constants[kind]))
            for kind in HEAD_KINDS
        }
        cfg = copy.deepcopy(self.cfg)
        cfg.cross_attn = copy.deepcopy(cross_attention(self.cfg))  # its own settings now: attn's out_bias may change
        # one out_bias setting per attention config: if a layer of a kind folds a replacement, every layer gets one
        cfg.attn.out_bias = cfg.attn.out_bias or folds["enc"] or folds["dec"]
        cfg.cross_attn.out_bias = cfg.cross_attn.out_bias or folds["cross"]
        out_bias = {"enc": cfg.attn.out_bias, "dec": cfg.attn.out_bias, "cross": cfg.cross_attn.out_bias}
        state, groups = self.state_dict(), {}
        for kind in HEAD_KINDS:
            groups[kind] = []
            for layer, (keep_H, r) in enumerate(zip(keeps[kind], constants[kind])):
                attn = self.attention(kind, layer).select_heads(keep_H, r, add_out_bias=out_bias[kind])
                groups[kind].append(attn.kv_groups)
                prefix = {"enc": "encoder.blocks", "dec": "decoder.blocks", "cross": "decoder.blocks"}[kind]
                site = "cross" if kind == "cross" else "attn"
                state.update({f"{prefix}.{layer}.{site}.{name}": t for name, t in attn.state_dict().items()})
        record_heads(cfg, keeps, groups)
        param = next(self.parameters())
        # Building the new model draws random init values that the state overwrites; keep the caller's random stream.
        with torch.random.fork_rng(devices=[]):
            selected = EncoderDecoder(cfg).to(device=param.device, dtype=param.dtype)
        selected.load_state_dict(state)
        selected.tie_weights()
        return selected.train(self.training)

    @property
    def max_heads(self) -> int:
        return max(self.heads_per_layer)

    def forward(
        self,
        src_BS: Tensor,
        tgt_BT: Tensor,
        gates: Gates | None = None,
        replacements: dict[str, list[Tensor | None]] | None = None,
        src_keep: Tensor | None = None,
        cache: dict | None = None,
        intervention: StackIntervention | None = None,
    ) -> Tensor:
        """Logits (B, T, vocab) of the decoder reading tgt (teacher forcing: position t predicts tgt's t + 1) and
        the encoder's output for src.

        gates: a dict by kind ("enc", "dec", "cross"), each (L, H) or (B, L, H) in [0, 1]; replacements: a dict by
        kind, each one tensor per layer broadcastable to that kind's z (B, T, H, D) or None (zero ablation);
        src_keep: (B, S) bool, False at padded source positions (no head attends to them); cache: if a dict, gets the
        activations by site name (model/sites.py): <enc|dec>.blocks.<l>.resid_pre and .attn.z, dec.blocks.<l>.cross.z
        (z after the gates) and enc.out. Each stack runs one intervention (`stack_intervention`): the kinds' gates
        as `Gates` hooks at their sites, the cache as its reads. intervention: a user's hooks and reads at the stack
        sites (StackIntervention), in place of gates, replacements and cache."""
        gates, replacements = self.check_kinds(gates, "gates"), self.check_kinds(replacements, "replacements")
        if intervention is not None:
            check_alone(intervention, gates or replacements or cache)
            memory = self.encode(src_BS, src_keep=src_keep, intervention=intervention.enc)
            return self.decode(tgt_BT, memory, src_keep, intervention=intervention.dec)
        memory = self.encode(src_BS, gates.get("enc"), replacements.get("enc"), src_keep, cache)
        logits = self.decode(tgt_BT, memory, src_keep, gates.get("dec"), gates.get("cross"), replacements, cache)
        if cache is not None:
            cache["enc.out"] = memory
        return logits

    def encode(
        self,
        src_BS: Tensor,
        gates: Tensor | None = None,
        replacements: list[Tensor | None] | None = None,
        src_keep: Tensor | None = None,
        cache: dict | None = None,
        intervention: Intervention | None = None,
    ) -> Tensor:
        """The encoder's output (B, S, C), after its final norm: what every cross-attention head reads. cache: if a
        dict, gets the encoder's resid_pre and attn.z by site name (enc.blocks.<l>.<site>). intervention: the
        encoder's (StackIntervention.enc), in place of gates, replacements and cache."""
        enc = self.encoder
        if intervention is None:
            hooks = [] if gates is None else GateHook(gates, replacements).hooks()
            stack = stack_intervention(enc, hooks, cache is not None, ())
        else:
            check_alone(intervention, gates is not None or replacements or cache is not None)
            stack = intervention
        stream_BSC = enc.embed(src_BS)
        if stack is not None and stack.touches(None):
            stream_BSC = stack.at(EMBED, stream_BSC)
        out_BSC = enc.ln_f(enc.forward_layers(stream_BSC, 0, stack, keep_BT=src_keep))
        if cache is not None:
            cache.update(named_reads("enc", stack))
        return out_BSC if stack is None or not stack.touches(None) else stack.at(ENC_OUT, out_BSC)

    def memory_of(self, stream_BSC: Tensor) -> Tensor:
        """What cross-attention reads of an encoder's final stream: it through the encoder's final norm (encode's
        last step; the circuits core's per-receiver copies of the encoder's output pass it one by one)."""
        return self.encoder.ln_f(stream_BSC)

    @torch.no_grad()
    def encoder_patterns(self, src_BS: Tensor, src_keep: Tensor | None = None, gates: Tensor | None = None) -> Tensor:
        """(B, L, H, S, S) every encoder head's attention weights (query position, key position), read at each
        layer's attn.pattern in one encoder pass (the explicit attention path); padded keys (src_keep False) get
        weight 0. gates: the encoder's (L, H) or (B, L, H), as in encode."""
        enc = self.encoder
        hooks = [] if gates is None else GateHook(gates).hooks()
        intervention = reads(("attn.pattern",), range(enc.n_layers), hooks)
        enc.forward_layers(enc.embed(src_BS), 0, intervention, keep_BT=src_keep)
        return torch.stack([intervention.read("attn.pattern", layer) for layer in range(enc.n_layers)], dim=1)

    def decode(
        self,
        tgt_BT: Tensor,
        memory_BSC: Tensor,
        src_keep: Tensor | None = None,
        gates: Tensor | None = None,
        cross_gates: Tensor | None = None,
        replacements: dict[str, list[Tensor | None]] | None = None,
        cache: dict | None = None,
        intervention: Intervention | None = None,
    ) -> Tensor:
        """The decoder's logits (B, T, vocab) given the encoder's output; gates the decoder self-attention's,
        cross_gates the cross-attention's (a `Gates` hook at each layer's cross.z); replacements by kind and cache as
        in forward; intervention: the decoder's (StackIntervention.dec), in place of gates, replacements and cache."""
        dec = self.decoder
        stack = self.decoder_intervention(gates, cross_gates, replacements, cache, intervention)
        stream_BTC = self.run_decoder(tgt_BT, memory_BSC, src_keep, stack, cache)
        if stack is None or not stack.touches(None):
            return dec.unembed(stream_BTC)
        normed_BTC = stack.at(FINAL_NORM, dec.ln_f(stream_BTC))
        return stack.at(LOGITS, dec.lm_head(dec.readout(normed_BTC)))

    def decode_stream(
        self,
        tgt_BT: Tensor,
        memory_BSC: Tensor,
        src_keep: Tensor | None = None,
        gates: Tensor | None = None,
        cross_gates: Tensor | None = None,
        replacements: dict[str, list[Tensor | None]] | None = None,
        cache: dict | None = None,
    ) -> Tensor:
        """decode's final stream (B, T, C), before the final norm and the unembedding: what a scan's metric reads at
        its score points."""
        stack = self.decoder_intervention(gates, cross_gates, replacements, cache, None)
        return self.run_decoder(tgt_BT, memory_BSC, src_keep, stack, cache)

    def decoder_intervention(self, gates, cross_gates, replacements, cache, intervention):
        """The decoder stack's intervention: the user's (alone), or the gates' hooks by kind and the cache's reads."""
        if intervention is not None:
            given = gates is not None or cross_gates is not None or replacements or cache is not None
            check_alone(intervention, given)
            return intervention
        replacements = replacements or {}
        hooks = [] if gates is None else GateHook(gates, replacements.get("dec")).hooks()
        if cross_gates is not None:
            cross = GateHook(cross_gates, replacements.get("cross"), site="cross.z", key="gates['cross']")
            hooks += cross.hooks()
        return stack_intervention(self.decoder, hooks, cache is not None, ("cross.z",))

    def run_decoder(self, tgt_BT, memory_BSC, src_keep, stack, cache) -> Tensor:
        """The decoder's layers from its embedding (after the stack's embed hooks), its cache filled where asked."""
        dec = self.decoder
        stream_BTC = dec.embed(tgt_BT)
        if stack is not None and stack.touches(None):
            stream_BTC = stack.at(EMBED, stream_BTC)
        stream_BTC = dec.forward_layers(stream_BTC, 0, stack, memory=Memory(memory_BSC, src_keep))
        if cache is not None:
            cache.update(named_reads("dec", stack))
        return stream_BTC

    @staticmethod
    def check_kinds(by_kind: dict | None, key: str) -> dict:
        if by_kind is None:
            return {}
        if not isinstance(by_kind, dict):
            allowed = f"an encoder-decoder takes a dict by kind ({', '.join(HEAD_KINDS)}), each (L, H) or (B, L, H)"
            raise ConfigError(key, type(by_kind).__name__, allowed)
        unknown = [kind for kind in by_kind if kind not in HEAD_KINDS]
        if unknown:
            raise ConfigError(key, unknown[0], f"no such head kind; allowed: {', '.join(HEAD_KINDS)}")
        return by_kind

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())


# Each kind's config keys: its heads per layer and its key/value groups per layer
KIND_HEAD_KEYS = {
    "enc": ("encoder_heads_per_layer", "encoder_kv_groups_per_layer"),
    "dec": ("heads_per_layer", "kv_groups_per_layer"),
    "cross": ("cross_heads_per_layer", "cross_kv_groups_per_layer"),
}


def record_heads(cfg: ModelConfig, keeps: dict[str, list[Tensor]], groups: dict[str, list[list[int]]]) -> None:
    """A pruned encoder-decoder's config records each kind's heads per layer where they differ from the kind's
    configured count (or were recorded before), and then its key/value groups where the kind shares them."""
    for kind, (heads_key, groups_key) in KIND_HEAD_KEYS.items():
        attn = cfg.cross_attn if kind == "cross" else cfg.attn
        heads = [int(keep_H.sum()) for keep_H in keeps[kind]]
        if getattr(cfg, heads_key) is None and all(n == attn.n_heads for n in heads):
            continue
        setattr(cfg, heads_key, heads)
        if attn.n_kv_heads is not None or getattr(cfg, groups_key) is not None:
            setattr(cfg, groups_key, groups[kind])


CACHED_KINDS = ("resid_pre", "attn.z")  # what an encoder-decoder's cache keeps of every layer of both stacks


def stack_intervention(
    stack: Transformer, hooks: list[tuple[Site, Hook]], cached: bool, stack_kinds: tuple[str, ...]
) -> Intervention | None:
    """One stack's intervention: the gates' hooks and, when a cache is asked, reads of CACHED_KINDS (and the stack's
    own kinds, cross.z) at every layer; None when there is neither (the plain forward)."""
    if not hooks and not cached:
        return None
    kinds = (*CACHED_KINDS, *stack_kinds) if cached else ()
    return reads(kinds, range(stack.n_layers), hooks)


def check_alone(intervention: object, given: object) -> None:
    """A user's intervention runs alone: gates, replacements and a cache are hooks and reads of their own."""
    if given:
        allowed = "an intervention runs alone: give gates, replacements and cache as its hooks and reads"
        raise ConfigError("intervention", "with gates or a cache", allowed)


def named_reads(stack: str, intervention: Intervention) -> dict[str, Tensor]:
    """A stack's reads by the encoder-decoder's site names (enc.blocks.0.attn.z), z after the gates."""
    return {f"{stack}.{name}": value for name, value in intervention.cache.items()}


def build_model(cfg: ModelConfig) -> "Transformer | EncoderDecoder":
    """The model a config describes: an EncoderDecoder when model.encoder_layers > 0, else a one-stack Transformer."""
    return EncoderDecoder(cfg) if cfg.encoder_layers else Transformer(cfg)


def head_kinds(model: "Transformer | EncoderDecoder") -> dict[str | None, tuple[int, int]]:
    """(layers, heads) by kind: an encoder-decoder's enc, dec and cross; a one-stack model's one kind, None."""
    if isinstance(model, EncoderDecoder):
        return model.head_kinds
    return {None: (model.n_layers, model.max_heads)}


def gates_off(
    model: "Transformer | EncoderDecoder", labels: list[str], key: str = "mask", dtype: torch.dtype = torch.float32
) -> "Tensor | Gates":
    """Gates with the labelled heads at 0 and every other head at 1: an (L, H) tensor for a one-stack model (labels
    L1H3), a dict by kind for an encoder-decoder (labels enc.L1H3, dec.L1H3, cross.L1H3). A label naming a kind the
    model lacks, or no kind where the model has several, is one ConfigError under `key`."""
    kinds = head_kinds(model)
    gates = {kind: torch.ones(shape, dtype=dtype) for kind, shape in kinds.items()}
    for label in labels:
        kind, layer, head = parse_head_of(model, label, key)
        gates[kind][layer, head] = 0
    return gates[None] if None in kinds else gates


def parse_head_of(model: "Transformer | EncoderDecoder", label: str, key: str = "mask") -> tuple[str | None, int, int]:
    """(kind, layer, head) of a label naming a head the model has; one ConfigError otherwise."""
    kinds = head_kinds(model)
    parsed = parse_kind_head(label)
    several = None not in kinds
    example = "enc.L1H3, dec.L1H3 or cross.L1H3" if several else "L1H3"
    if parsed is None:
        raise ConfigError(key, label, f"a head is named like {example}")
    kind, layer, head = parsed
    if kind not in kinds:
        if several and kind is None:
            allowed = f"an encoder-decoder's heads are named by kind: {example}"
        elif several:
            allowed = f"no such head kind; this encoder-decoder's: {', '.join(HEAD_KINDS)}"
        else:
            what = KIND_NAMES.get(kind, f"kind {kind!r}")
            allowed = f"names {what} heads, which this one-stack model lacks: its heads are named like L1H3"
        raise ConfigError(key, label, allowed)
    layers, heads = kinds[kind]
    if not (0 <= layer < layers and 0 <= head < heads):
        shown = kind_head_label(kind, layers - 1, heads - 1)
        raise ConfigError(key, label, f"no such head: the last {kind or 'head'} is {shown}")
    return kind, layer, head
