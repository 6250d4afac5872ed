"""Named sites: every activation an intervention can read or change, by a public name, parsed once into a `Site`.

The names grow the circuits graph's (which names heads L1H2 and their inputs L1H2.q) into TransformerLens's style:

    embed                      (B, T, C)   the stream after the embedding (scaled, plus learned positions)
    blocks.{l}.resid_pre       (B, T, C)   the stream into layer l
    blocks.{l}.attn.q_input    (B, T, H, C)  what each query head reads, before the layer's input norm
    blocks.{l}.attn.k_input    (B, T, G, C)  what each key/value head reads (G = H without grouped-query attention)
    blocks.{l}.attn.v_input    (B, T, G, C)
    blocks.{l}.attn.qkv_input  (B, H, 3, T, C)  each query head's own q, k, v inputs before the layer's input norm
    blocks.{l}.attn.qkv_normed (B, H, 3, T, C)  the same after the norm (k, v per query head even under GQA)
    blocks.{l}.attn.q          (B, T, H, D)  queries, after q/k norms and rotary positions
    blocks.{l}.attn.k          (B, T, G, D)  keys per key/value head (shared by its group of query heads)
    blocks.{l}.attn.v          (B, T, G, D)
    blocks.{l}.attn.pattern    (B, H, T, T)  attention weights (query position, key position)
    blocks.{l}.attn.z          (B, T, H, D)  each head's output before W_O (after gates, if the forward has any)
    blocks.{l}.attn_out        (B, T, C)   attention's output as added to the stream (after a post-norm)
    blocks.{l}.mlp.input       (B, T, C)   the MLP's own copy of the stream it reads, before its norm
    blocks.{l}.mlp_in          (B, T, C)   the MLP's input after its norm
    blocks.{l}.mlp.hidden      (B, T, F)   the MLP's hidden units, after the activation (and the gate's product)
    blocks.{l}.mlp_out         (B, T, C)   the MLP's output as added to the stream (after a post-norm)
    blocks.{l}.resid_post      (B, T, C)   the stream out of layer l
    final_norm                 (B, T, C)   the final norm's output, the unembedding's input
    logits                     (B, T, V)

An encoder-decoder (model/encoder_decoder.py) names its sites with its stack first, `enc.` or `dec.`, and its decoder
layers have cross-attention's own:

    enc.blocks.{l}.<site>      the encoder's layer l (its sites as above, bidirectional)
    dec.blocks.{l}.<site>      the decoder's layer l
    dec.blocks.{l}.cross.z     (B, T, H_cross, D_cross)  each cross-attention head's output before its W_O (after gates)
    enc.out                    (B, S, C)   the encoder's output after its final norm: what cross-attention reads
    enc.embed, dec.embed       each stack's stream after its embedding (one token embedding, shared)
    dec.final_norm, dec.logits the decoder's final norm and logits (the encoder has none: enc.out is its final norm)

so a site's stack prefix is its heads' kind in labels.py (enc.L1H3 is enc.blocks.1.attn.z[:, :, 3], dec.L1H3
dec.blocks.1.attn.z[:, :, 3], cross.L1H3 dec.blocks.1.cross.z[:, :, 3]). An encoder-decoder's forward fills a cache
by these names (EncoderDecoder.forward's cache: resid_pre, attn.z, cross.z, enc.out); its stacks run
Transformer.forward_layers with an intervention each, whose sites are the stack's own (blocks.1.cross.z).

B batch, T positions, C model width, H query heads, G key/value heads, D head width, F MLP hidden width, V vocabulary.
A site's k/v entries under grouped-query attention address the shared key/value head: changing k_input[:, :, g]
changes the keys every query head of group g reads. The circuits graph's receivers are per query head: attn.qkv_input
and attn.qkv_normed give head h inputs of its own for q, k and v, k and v projected by its key/value head's weights
from h's own inputs (so heads of one group may see different keys), attended by the explicit softmax
(MultiHeadAttention.heads_from_inputs); a hook at either makes the layer run its heads that way. attn.qkv_input is
handed to hooks as a read-only broadcast of the stream (return a new tensor rather than editing it in place).
mlp.input is what the MLP alone reads (after attention, or the layer's input in a parallel-residual block): a hook
there changes the MLP's input, not the stream that goes on (TransformerLens's hook_mlp_in). Attention-only models
have no mlp sites.
"""

import re
from dataclasses import dataclass
from functools import lru_cache

from headcount.errors import ConfigError

MODEL_SITES = ("embed", "final_norm", "logits")
BLOCK_SITES = (
    "resid_pre",
    "attn.q_input",
    "attn.k_input",
    "attn.v_input",
    "attn.qkv_input",
    "attn.qkv_normed",
    "attn.q",
    "attn.k",
    "attn.v",
    "attn.pattern",
    "attn.z",
    "attn_out",
    "mlp.input",
    "mlp_in",
    "mlp.hidden",
    "mlp_out",
    "resid_post",
)
SHAPES = {
    "embed": "(B, T, C)",
    "resid_pre": "(B, T, C)",
    "attn.q_input": "(B, T, H, C)",
    "attn.k_input": "(B, T, G, C)",
    "attn.v_input": "(B, T, G, C)",
    "attn.qkv_input": "(B, H, 3, T, C)",
    "attn.qkv_normed": "(B, H, 3, T, C)",
    "attn.q": "(B, T, H, D)",
    "attn.k": "(B, T, G, D)",
    "attn.v": "(B, T, G, D)",
    "attn.pattern": "(B, H, T, T)",
    "attn.z": "(B, T, H, D)",
    "attn_out": "(B, T, C)",
    "mlp.input": "(B, T, C)",
    "mlp_in": "(B, T, C)",
    "mlp.hidden": "(B, T, F)",
    "mlp_out": "(B, T, C)",
    "resid_post": "(B, T, C)",
    "final_norm": "(B, T, C)",
    "logits": "(B, T, V)",
    "cross.z": "(B, T, H, D)",
    "out": "(B, S, C)",
}
HEAD_INPUTS = ("attn.q_input", "attn.k_input", "attn.v_input")
OWN_HEAD_INPUTS = ("attn.qkv_input", "attn.qkv_normed")  # per query head, q, k, v stacked
_BLOCK_NAME = re.compile(r"blocks\.(\d+)\.(.+)")
KEY = "hooks.site"


@dataclass(frozen=True)
class Site:
    """One named activation: `kind` is the name without its layer ("attn.z", "logits"), `layer` None for the model's
    own sites (embed, final_norm, logits), `stack` an encoder-decoder's stack ("enc", "dec") as a hook there sees it
    (its name then starts with the stack: enc.blocks.1.attn.z); a stack's own forward looks sites up without it."""

    kind: str
    layer: int | None = None
    stack: str | None = None

    @property
    def name(self) -> str:
        name = self.kind if self.layer is None else f"blocks.{self.layer}.{self.kind}"
        return name if self.stack is None else f"{self.stack}.{name}"

    @property
    def shape(self) -> str:
        return SHAPES[self.kind]

    def __str__(self) -> str:
        return self.name


@lru_cache(maxsize=4096)
def parse_site(name: str) -> Site:
    """The one parser of site names: a Site, or a one-line ConfigError naming the bad name and what is allowed."""
    if name in MODEL_SITES:
        return Site(name)
    found = _BLOCK_NAME.fullmatch(name) if isinstance(name, str) else None
    if found is None or found.group(2) not in BLOCK_SITES:
        allowed = f"allowed: {', '.join(MODEL_SITES)} or blocks.<layer>.<{'|'.join(BLOCK_SITES)}>"
        raise ConfigError(KEY, name, allowed)
    return Site(found.group(2), int(found.group(1)))


def site_names(n_layers: int, mlp: bool = True) -> list[str]:
    """Every site of a model with n_layers layers, in the order a forward reaches them, but the per-head inputs of the
    circuits graph (OWN_HEAD_INPUTS), which run a layer's heads another way and are asked for by name."""
    kinds = [k for k in BLOCK_SITES if (mlp or not k.startswith("mlp")) and k not in OWN_HEAD_INPUTS]
    return ["embed", *(Site(k, layer).name for layer in range(n_layers) for k in kinds), "final_norm", "logits"]


STACKS = ("enc", "dec")  # an encoder-decoder's stacks: the prefixes of its site names
STACK_SITES = ("cross.z",)  # sites of a decoder layer with cross-attention, beside BLOCK_SITES
STACK_MODEL_SITES = {"enc": ("embed", "out"), "dec": MODEL_SITES}  # each stack's sites outside its layers
_STACK_NAME = re.compile(r"(enc|dec)\.(.+)")


def parse_stack_site(name: str) -> tuple[str, Site]:
    """(stack, Site) of an encoder-decoder's site name, the Site without its stack (as the stack's forward looks it
    up); a one-line ConfigError naming what is allowed otherwise."""
    found = _STACK_NAME.fullmatch(name) if isinstance(name, str) else None
    if found is not None and found.group(2) in STACK_MODEL_SITES[found.group(1)]:
        return found.group(1), Site(found.group(2))
    block = _BLOCK_NAME.fullmatch(found.group(2)) if found is not None else None
    kinds = BLOCK_SITES + (STACK_SITES if found is not None and found.group(1) == "dec" else ())
    if block is None or block.group(2) not in kinds:
        allowed = (
            f"allowed: enc.embed, enc.out, dec.embed, dec.final_norm, dec.logits, "
            f"<enc|dec>.blocks.<layer>.<{'|'.join(BLOCK_SITES)}> or dec.blocks.<layer>.cross.z"
        )
        raise ConfigError(KEY, name, allowed)
    return found.group(1), Site(block.group(2), int(block.group(1)))


def stack_site_names(encoder_layers: int, decoder_layers: int, mlp: bool = True) -> list[str]:
    """Every site of an encoder-decoder, in the order its forward reaches them: the encoder's (enc.embed, its
    layers, enc.out), then the decoder's (dec.embed, its layers with cross.z after attn_out, final_norm, logits);
    as site_names, without the circuits graph's per-head inputs (OWN_HEAD_INPUTS)."""
    kinds = [k for k in BLOCK_SITES if (mlp or not k.startswith("mlp")) and k not in OWN_HEAD_INPUTS]
    decoder_kinds = [*kinds[: kinds.index("attn_out") + 1], *STACK_SITES, *kinds[kinds.index("attn_out") + 1 :]]
    encoder = [Site(k, layer, "enc").name for layer in range(encoder_layers) for k in kinds]
    decoder = [Site(k, layer, "dec").name for layer in range(decoder_layers) for k in decoder_kinds]
    return ["enc.embed", *encoder, "enc.out", "dec.embed", *decoder, "dec.final_norm", "dec.logits"]
