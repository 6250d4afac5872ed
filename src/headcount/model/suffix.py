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
"""

from dataclasses import dataclass

import torch
from torch import Tensor

from headcount.model.attention import MultiHeadAttention
from headcount.model.block import Block
from headcount.model.intervention import Gates
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


def clean_keys_values(block: Block, resid_BTC: Tensor) -> tuple[Tensor, Tensor]:
    """The layer's keys and values (B, G, T, D) on the clean stream into it, as its attention computes them."""
    _, k_BGTD, v_BGTD = block.attn.project(block.ln_attn(resid_BTC))
    return k_BGTD, v_BGTD


def suffix_block(
    block: Block, x_XSC: Tensor, layout: SuffixLayout, clean_kv: tuple[Tensor, Tensor], gates: Gates | None = None
) -> Tensor:
    """The block's output at the layout's slots, x the stream into it there (X = copies * B rows, mask-major).
    clean_kv: the clean keys and values (B, G, T, D) (`clean_keys_values`); gates: the head gates' hook at the
    layer's attn.z site, its replacements and positions given at the slots (X, S, ...), or None."""
    z_XSHD = suffix_heads(block.attn, block.ln_attn(x_XSC), layout, clean_kv)
    if gates is not None:
        z_XSHD = gates(z_XSHD, Site("attn.z", block.layer))
    return block.finish(x_XSC, z_XSHD)


def suffix_heads(attn: MultiHeadAttention, x_XSC: Tensor, layout: SuffixLayout, clean_kv: tuple[Tensor, Tensor]):
    """z (X, S, H, D) at the slots: the slots' queries over the clean keys before p_b and the slots' own keys (the
    projection and the attention are MultiHeadAttention's, at the slots' absolute positions)."""
    X, S, _ = x_XSC.shape
    copies = X // len(layout.start_B)
    if attn.n_heads == 0:  # a layer pruned to no heads: z is empty (SDPA refuses zero-size inputs)
        return x_XSC.new_zeros(X, S, 0, attn.head_dim)
    q_XHSD, k_XGSD, v_XGSD = attn.project(x_XSC, at=(layout.positions_BS.repeat(copies, 1), layout.T))
    clean_k_BGTD, clean_v_BGTD = clean_kv
    k_XGKD = torch.cat([clean_k_BGTD.repeat(copies, 1, 1, 1), k_XGSD], dim=2)
    v_XGKD = torch.cat([clean_v_BGTD.repeat(copies, 1, 1, 1), v_XGSD], dim=2)
    allowed_X1SK = layout.allowed_BSK(attn.features.window).repeat(copies, 1, 1)[:, None]
    return attn.attend_allowed(q_XHSD, k_XGKD, v_XGKD, allowed_X1SK)
