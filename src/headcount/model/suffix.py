"""Run layers at a few positions of each sequence, the rest read from a clean pass: the part after an unchanged prefix.

When an intervention changes nothing before position p_b of sequence b (a patched head whose corrupted prompt agrees
with the clean one up to p_b), every layer's stream, keys and values before p_b are the clean pass's, and positions
after the last one scored cannot reach a score (attention is causal). `SuffixLayout` says which positions of each
sequence run, [p_b, e_b), left-aligned into S slots; `suffix_block` runs one layer there, reading the clean keys and
values of positions before p_b: the same numbers as the layer on the whole sequence at those positions, up to float
rounding. Every operation on heads is the model's own code: `MultiHeadAttention.project` at the slots' absolute
positions (rotary angles computed for the whole length T, so dynamic scaling sees the same T; shortformer's learned
q/k positions), `attend_allowed` over the clean keys and the slots' own (soft-capped scores included), the `Gates`
hook and `Block.finish`; what is here is which keys each slot sees (the causal and sliding-window mask by absolute
position) and the gathering and scattering of slots.

`SuffixRun` is the same for a caller that runs the layers itself with an intervention (path patching's run from its
receivers, circuits/path_patching.py): each block's own forward at the slots with its heads from `suffix_heads`, and
heads that read q, k and v from inputs of their own (receiver heads, `Block.heads_from_inputs` for the slots'
queries), whose inputs before p_b are the clean stream.
"""

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from headcount.model.attention import MultiHeadAttention
from headcount.model.block import Block
from headcount.model.intervention import Gates, Intervention
from headcount.model.sites import Site


@dataclass
class SuffixLayout:
    """Which positions run: slot s of sequence b is position start_B[b] + s, real while s < end_B[b] - start_B[b]."""

    start_B: Tensor  # (B,) int64: the first position that runs (p_b)
    end_B: Tensor  # (B,) int64: one past the last (e_b); at least start_B
    T: int  # the sequences' full length

    @property
    def S(self) -> int:
        return max(int((self.end_B - self.start_B).max()), 1)

    @property
    def positions_BS(self) -> Tensor:
        """(B, S) the absolute position of each slot; padding slots continue past e_b, clamped to T - 1."""
        s_S = torch.arange(self.S, device=self.start_B.device)
        return (self.start_B[:, None] + s_S[None]).clamp_max(self.T - 1)

    def gather(self, x_XT: Tensor) -> Tensor:
        """x (X, T, ...) at the slots' positions: (X, S, ...), X = copies * B rows, mask-major."""
        positions_XS = self.positions_BS.repeat(len(x_XT) // len(self.start_B), 1)
        index = positions_XS.view(*positions_XS.shape, *([1] * (x_XT.ndim - 2)))
        return x_XT.gather(1, index.expand(-1, -1, *x_XT.shape[2:]))

    def scatter_into(self, full_XTC: Tensor, suffix_XSC: Tensor) -> Tensor:
        """full (X, T, C) with the suffix's real slots written back at their positions (X = copies * B, mask-major)."""
        B = len(self.start_B)
        copies = len(full_XTC) // B
        t_T = torch.arange(self.T, device=full_XTC.device)
        inside_BT = (t_T[None] >= self.start_B[:, None]) & (t_T[None] < self.end_B[:, None])
        slot_BT = (t_T[None] - self.start_B[:, None]).clamp(0, self.S - 1)
        slot_XTC = slot_BT.repeat(copies, 1)[:, :, None].expand(-1, -1, full_XTC.shape[-1])
        taken_XTC = suffix_XSC.gather(1, slot_XTC)
        return torch.where(inside_BT.repeat(copies, 1)[:, :, None], taken_XTC, full_XTC)

    def allowed_BSK(self, window: int | None) -> Tensor:
        """(B, S, T + S) bool: the keys each slot's query attends to; the clean keys of positions before p_b come
        first (T of them), then the suffix's own (S), causal and within the window by absolute position."""
        pos_BS = self.start_B[:, None] + torch.arange(self.S, device=self.start_B.device)[None]
        clean_BT = torch.arange(self.T, device=pos_BS.device)[None].expand(len(pos_BS), -1)
        clean_ok_BST = (clean_BT < self.start_B[:, None])[:, None, :]
        suffix_ok_BSS = pos_BS[:, None, :] <= pos_BS[:, :, None]
        if window is not None:
            clean_ok_BST = clean_ok_BST & (pos_BS[:, :, None] - clean_BT[:, None, :] < window)
            suffix_ok_BSS = suffix_ok_BSS & (pos_BS[:, :, None] - pos_BS[:, None, :] < window)
        return torch.cat([clean_ok_BST.expand(-1, self.S, -1), suffix_ok_BSS], dim=2)

    def from_first_point(self, points_BT: Tensor) -> tuple["SuffixLayout", Tensor]:
        """The slots from each sequence's first score point on, the only ones whose last-layer output a score point
        reads (a layer's keys and values still come from every slot): their layout, and (B, S') their slot indices
        in this layout (padding slots point at a real slot; their outputs are never written back)."""
        t_T = torch.arange(self.T, device=points_BT.device)
        inside_BT = points_BT & (t_T >= self.start_B[:, None]) & (t_T < self.end_B[:, None])
        first_B = torch.where(inside_BT, t_T, self.end_B[:, None]).amin(1)
        inner = SuffixLayout(first_B, self.end_B, self.T)
        s_S = torch.arange(inner.S, device=points_BT.device)
        return inner, ((first_B - self.start_B)[:, None] + s_S[None]).clamp(0, self.S - 1)

    def allowed_BST(self, window: int | None) -> Tensor:
        """(B, S, T) bool: the keys of the whole sequence each slot's query attends to, causal and within the window
        by absolute position (padding slots, at position T - 1, see at least themselves)."""
        pos_BS1 = self.positions_BS[:, :, None]
        t_11T = torch.arange(self.T, device=pos_BS1.device)[None, None]
        allowed_BST = t_11T <= pos_BS1
        return allowed_BST if window is None else allowed_BST & (pos_BS1 - t_11T < window)


def first_difference(a: list[Tensor], b: list[Tensor]) -> Tensor:
    """(B,) int64: the first position at which any tensor (B, T, ...) of a differs from its partner in b (exactly, to
    the bit), T where none does."""
    differs_BT = torch.zeros(a[0].shape[:2], dtype=torch.bool, device=a[0].device)
    for x, y in zip(a, b, strict=True):
        differs_BT |= (x != y).flatten(2).any(2) if x.ndim > 2 else x != y
    T = differs_BT.shape[1]
    return torch.where(differs_BT.any(1), differs_BT.int().argmax(1), T)


def layout_of(start_B: Tensor, points_BT: Tensor) -> SuffixLayout | None:
    """The positions from start_B to each sequence's last score point, None (run them all) when that saves less than
    a quarter of the positions. A score point before start_B keeps its clean value."""
    T = points_BT.shape[1]
    end_B = torch.where(points_BT, torch.arange(T, device=points_BT.device) + 1, 0).amax(1)
    layout = SuffixLayout(start_B, torch.maximum(start_B, end_B), T)
    return layout if layout.S * 4 <= T * 3 else None


class SuffixRun:
    """A caller's run of the layers at the layout's slots (rows X = copies * B, mask-major), over the clean keys and
    values before each sequence's start. clean_into(layer): the clean stream into that layer (B, T, C), n_layers:
    into the final norm; asked once per layer."""

    def __init__(self, blocks: list[Block], layout: SuffixLayout, clean_into: Callable[[int], Tensor]):
        self.blocks, self.layout, self.clean_into = blocks, layout, clean_into
        self._clean: dict[int, Tensor] = {}
        self._kv: dict[int, tuple[Tensor, Tensor]] = {}

    def clean(self, layer: int) -> Tensor:
        if layer not in self._clean:
            self._clean[layer] = self.clean_into(layer)
        return self._clean[layer]

    def gather(self, x_XTC: Tensor) -> Tensor:
        """(X, S, C): x at the slots."""
        return self.layout.gather(x_XTC)

    def forward_layers(self, x_XSC: Tensor, start: int, intervention: Intervention | None = None) -> Tensor:
        """The stream after the last layer at the slots, x the stream into layer `start` there: each block's own
        forward with the intervention (sites at the slots, (X, S, ...)), its heads `suffix_heads`."""
        for layer in range(start, len(self.blocks)):
            heads = lambda normed, layer=layer: self.heads(layer, normed)  # noqa: E731
            x_XSC = self.blocks[layer].forward_with_heads(x_XSC, intervention, heads)
        return x_XSC

    def heads(self, layer: int, normed_XSC: Tensor) -> Tensor:
        """z (X, S, H, D) of the layer's heads, from the normed stream into the layer at the slots."""
        if layer not in self._kv:
            self._kv[layer] = clean_keys_values(self.blocks[layer], self.clean(layer))
        return suffix_heads(self.blocks[layer].attn, normed_XSC, self.layout, self._kv[layer])

    def heads_from_inputs(self, layer: int) -> Callable[[Tensor, Tensor], Tensor]:
        """The layer's Block.heads_from_inputs at the slots: z (X, S, K, D) of K heads each reading q, k, v from its own
        inputs there (X, K, 3, S, C). The inputs before the start are the clean stream's, so the heads project the
        whole sequence (a head's own projections: small) and only the slots' queries attend."""
        block = self.blocks[layer]

        def at_slots_only(x_XKWSC: Tensor, heads_K: Tensor) -> Tensor:
            X, K, W, S, C = x_XKWSC.shape
            B, T = len(self.layout.start_B), self.layout.T
            rows_NSC = x_XKWSC.permute(1, 2, 0, 3, 4).reshape(K * W * X, S, C)  # (k, w)-major: row % B the example
            full_NTC = self.layout.scatter_into(self.clean(layer).repeat(K * W * X // B, 1, 1), rows_NSC)
            full_XKWTC = full_NTC.view(K, W, X, T, C).permute(2, 0, 1, 3, 4)
            positions_XS = self.layout.positions_BS.repeat(X // B, 1)
            allowed_XST = self.layout.allowed_BST(block.attn.features.window).repeat(X // B, 1, 1)
            return block.heads_from_inputs(full_XKWTC, heads_K, queries=(positions_XS, allowed_XST))

        return at_slots_only

    def scatter(self, x_XSC: Tensor, layer: int) -> Tensor:
        """(X, T, C): the clean stream into `layer` (n_layers: the final one) with the slots' values written in."""
        clean_BTC = self.clean(layer)
        return self.layout.scatter_into(clean_BTC.repeat(len(x_XSC) // len(clean_BTC), 1, 1), x_XSC)


def clean_keys_values(block: Block, resid_BTC: Tensor) -> tuple[Tensor, Tensor]:
    """The layer's keys and values (B, G, T, D) on the clean stream into it, as its attention computes them."""
    _, k_BGTD, v_BGTD = block.attn.project(block.ln_attn(resid_BTC))
    return k_BGTD, v_BGTD


def suffix_block(
    block: Block,
    x_XSC: Tensor,
    layout: SuffixLayout,
    clean_kv: tuple[Tensor, Tensor],
    gates: Gates | None = None,
    queries_XQ: Tensor | None = None,
) -> Tensor:
    """The block's output at the layout's slots, x the stream into it there (X = copies * B rows, mask-major).
    clean_kv: the clean keys and values (B, G, T, D) (`clean_keys_values`); gates: the head gates' hook at the
    layer's attn.z site, its replacements and positions given at the slots (X, S, ...), or None. queries_XQ: the
    output at these slots only, (X, Q, C) (every slot's keys and values still count)."""
    z_XQHD = suffix_heads(block.attn, block.ln_attn(x_XSC), layout, clean_kv, queries_XQ)
    if queries_XQ is not None:
        x_XSC = at_slots(x_XSC, queries_XQ)
        if gates is not None:
            replacements = replacements_at_slots(gates.replacements, queries_XQ)
            gates = Gates(gates.gates, replacements, at_slots(gates.where, queries_XQ))
    if gates is not None:
        z_XQHD = gates(z_XQHD, Site("attn.z", block.layer))
    return block.finish(x_XSC, z_XQHD)


def replacements_at_slots(replacements: list[Tensor | None] | None, slots_XQ: Tensor) -> list[Tensor | None] | None:
    """Replacements at the slots (X, S, H, D) taken at slots_XQ; a constant per head (H, D) as it is."""
    if replacements is None:
        return None
    return [at_slots(r, slots_XQ) if r is not None and r.ndim == 4 else r for r in replacements]


def at_slots(x_XS: Tensor | None, slots_XQ: Tensor) -> Tensor | None:
    """x (X, S, ...) at the slots slots_XQ: (X, Q, ...)."""
    if x_XS is None:
        return None
    index = slots_XQ.view(*slots_XQ.shape, *([1] * (x_XS.ndim - 2)))
    return x_XS.gather(1, index.expand(-1, -1, *x_XS.shape[2:]))


def suffix_heads(
    attn: MultiHeadAttention,
    x_XSC: Tensor,
    layout: SuffixLayout,
    clean_kv: tuple[Tensor, Tensor],
    queries_XQ: Tensor | None = None,
) -> Tensor:
    """z (X, S, H, D) at the slots: the slots' queries over the clean keys before p_b and the slots' own keys (the
    projection and the attention are MultiHeadAttention's, at the slots' absolute positions); queries_XQ: z
    (X, Q, H, D) of these slots only (their queries over the same keys)."""
    X, S, _ = x_XSC.shape
    copies = X // len(layout.start_B)
    if attn.n_heads == 0:  # a layer pruned to no heads: z is empty (SDPA refuses zero-size inputs)
        return x_XSC.new_zeros(X, S if queries_XQ is None else queries_XQ.shape[1], 0, attn.head_dim)
    q_XHSD, k_XGSD, v_XGSD = attn.project(x_XSC, at=(layout.positions_BS.repeat(copies, 1), layout.T))
    clean_k_BGTD, clean_v_BGTD = clean_kv
    k_XGKD = torch.cat([clean_k_BGTD.repeat(copies, 1, 1, 1), k_XGSD], dim=2)
    v_XGKD = torch.cat([clean_v_BGTD.repeat(copies, 1, 1, 1), v_XGSD], dim=2)
    allowed_XSK = layout.allowed_BSK(attn.features.window).repeat(copies, 1, 1)
    if queries_XQ is not None:
        q_XHSD = at_slots(q_XHSD.transpose(1, 2), queries_XQ).transpose(1, 2)
        allowed_XSK = at_slots(allowed_XSK, queries_XQ)
    return attn.attend_allowed(q_XHSD, k_XGKD, v_XGKD, allowed_XSK[:, None])
