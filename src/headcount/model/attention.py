"""Multi-head self-attention, causal or bidirectional: the one place heads are defined.

Every operation on heads lives here, and everything else (the block, the ablation evaluator, structural pruning)
calls these rather than re-deriving the weight layout:

- `heads`: project to q, k, v (`project`, which also applies q/k norms and rotary positions), share each key/value
  head with its group of query heads, then attend, z_h = softmax(cap(q_h k_h^T * scale) + mask) v_h, by SDPA or, when
  the attention pattern is wanted or the scores are soft-capped (SDPA cannot cap), by the explicit reference path
  (`reference_attention`). The scale is 1 / sqrt(head_dim) or Gemma's query_pre_attn_scalar^(-1/2); the mask is
  causal, and on a sliding-window layer also hides positions `window` or more steps back (`AttentionFeatures`).
- `project_inputs` / `heads_from_inputs`: the same per-head projection, q/k norms, rotary positions and attention
  for heads that each read q, k and v from inputs of their own (path patching, the edge-patched forward, EAP's
  gradient taps, an intervention at a head's q/k/v input): the one place outside `project` that knows the layout.
- `attend_allowed`: queries over keys with a mask of which each sees, for the suffix evaluator's slots
  (model/suffix.py), which `project` projects at their absolute positions (`at`).
- `gate_z`: a gate g and a replacement r act on z before heads combine, z_h <- g z_h + (1 - g) r_h (the model's
  forward applies it through the `Gates` hook at the attn.z site, model/intervention.py).
- `combine_heads`: concatenation (one W_o slice per head) or summation (one W_o shared by all heads, as in the first
  Transformer), then the output projection.
- `select_heads`: structural pruning, a new module with only the kept heads; a removed head's constant replacement
  r_h W_o^h is the same at every position, so it folds into the output bias. Under grouped-query attention a
  key/value head goes only when all the query heads of its group go.
- Per-head weight views in TransformerLens's layout: W_Q (H, C, D), W_K, W_V (H_kv, C, D), W_O (H, D, C) and biases.
- `activation_floats` / `z_floats`: what a pass holds per position, for memory budgets.

A head is a query head. Grouped-query attention (`kv_groups`: how many consecutive query heads share each key/value
head, regular [H / H_kv] * H_kv as trained, any sizes after pruning) changes only where k and v come from: z stays
per query head, so gates, masks and replacements do not change.

(The module runs past the project's ~250-line guide on purpose: splitting it would put the weight layout in two places.)

The parameters are one fused `qkv` Linear whose output rows are laid out [q: H*D | k: H_kv*D | v: H_kv*D] (with
H_kv = H, the (3, H, D) layout of every headcount checkpoint) and one `out` Linear, plus `q_norm` and `k_norm`
(RMSNorm weights of width D, or H*D and H_kv*D over the whole projections) when the model has q/k norms; checkpoints
store them under those names. Tensor names carry their shape: B batch, T positions, C model width, H heads, G key/value
heads, D head width.
"""

import warnings
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from headcount.errors import ConfigError
from headcount.model.norm import RMSNorm
from headcount.model.rotary import Rotary


@dataclass(frozen=True)
class AttentionFeatures:
    """What a layer's attention does beyond softmax(q k^T / sqrt(D) + causal) v (config/model.py's keys)."""

    window: int | None = None  # sliding window: attend to the last `window` positions, itself included
    scale: float | None = None  # the scores' factor; None: head_dim ** -0.5
    softcap: float | None = None  # scores -> softcap * tanh(scores / softcap)
    qk_norm: str = "none"  # "head": RMSNorm over each head's q and k; "projection": over the whole q and k projections
    qk_norm_plus_one: bool = False  # the q/k norms' form: Gemma's (1 + w)
    norm_eps: float = 1e-5
    causal: bool = True  # false: every position attends to every position (an encoder's bidirectional attention)


def allowed_keys(T: int, window: int | None, device: torch.device, causal: bool = True) -> Tensor:
    """(T, T) bool: query t may attend to key s (causal, and within the window when there is one; every key when
    not causal)."""
    if not causal:
        return torch.ones(T, T, dtype=torch.bool, device=device)
    pos_T = torch.arange(T, device=device)
    distance_TT = pos_T[:, None] - pos_T[None, :]
    allowed_TT = distance_TT >= 0
    return allowed_TT if window is None else allowed_TT & (distance_TT < window)


class MultiHeadAttention(nn.Module):
    def __init__(
        self,
        d_model: int,
        n_heads: int,
        head_dim: int,
        combine: str = "concat",
        qkv_bias: bool = True,
        out_bias: bool = True,
        dropout: float = 0.0,
        kv_groups: list[int] | None = None,
        rotary: Rotary | None = None,
        features: AttentionFeatures | None = None,
        qk_positions: int = 0,
    ):
        """kv_groups: query heads per key/value head, in order, adding up to n_heads; None: one key/value head per
        query head. rotary: rotary positions applied to q and k, or None (positions enter elsewhere). features:
        sliding window, score scale, soft-cap and q/k norms (None: none of them). qk_positions: the number of positions
        of a learned table whose row t is added to position t's input of the queries and keys, not the values
        (model.positions=shortformer); 0: none."""
        super().__init__()
        self.features = features or AttentionFeatures()
        self.d_model, self.n_heads, self.head_dim = d_model, n_heads, head_dim
        self.combine, self.dropout = combine, dropout
        self.kv_groups = list(kv_groups) if kv_groups is not None else [1] * n_heads
        if sum(self.kv_groups) != n_heads:
            raise ValueError(f"kv_groups {self.kv_groups} must add up to n_heads={n_heads}")
        self.n_kv_heads = len(self.kv_groups)
        self.grouped = self.n_kv_heads != n_heads
        # The key/value head each query head reads; not a checkpoint entry, the config rebuilds it.
        kv_of_H = torch.tensor([kv for kv, size in enumerate(self.kv_groups) for _ in range(size)], dtype=torch.long)
        self.register_buffer("kv_head_of", kv_of_H, persistent=False)
        self.rotary = rotary
        with warnings.catch_warnings():
            # A layer structurally pruned to zero heads has empty projections; initialising them is a harmless no-op.
            warnings.filterwarnings("ignore", "Initializing zero-element tensors is a no-op")
            self.qkv = nn.Linear(d_model, (n_heads + 2 * self.n_kv_heads) * head_dim, bias=qkv_bias)
            # concat: W_o is (H*D) x C, head h owns rows h*D:(h+1)*D. sum: W_o is D x C, shared by every head.
            self.out = nn.Linear(n_heads * head_dim if combine == "concat" else head_dim, d_model, bias=out_bias)
            # "emb" in its name: weight decay spares it, as it spares the model's other embeddings
            self.pos_emb = nn.Embedding(qk_positions, d_model) if qk_positions else None
            f = self.features
            widths = {"head": (head_dim, head_dim), "projection": (n_heads * head_dim, self.n_kv_heads * head_dim)}
            q_width, k_width = widths.get(f.qk_norm, (0, 0))
            self.q_norm = RMSNorm(q_width, f.norm_eps, f.qk_norm_plus_one) if q_width else None
            self.k_norm = RMSNorm(k_width, f.norm_eps, f.qk_norm_plus_one) if k_width else None

    def forward(self, x_BTC: Tensor, gate: Tensor | None = None, replacement: Tensor | None = None) -> Tensor:
        """The layer's output (B, T, C): heads, gated, combined. Arguments as in `gate_z`."""
        return self.combine_heads(self.gate_z(self.heads(x_BTC), gate, replacement))

    def heads(self, x_BTC: Tensor, bias: Tensor | None = None) -> Tensor:
        """z (B, T, H, D) from the layer's normed input; bias as in `attend`."""
        return self.attend(*self.project(x_BTC), bias=bias)

    def cross_heads(self, x_BTC: Tensor, memory_BSC: Tensor, bias: Tensor | None = None) -> Tensor:
        """Cross-attention's z (B, T, H, D): queries from x, keys and values from the memory (`project_cross`)."""
        return self.attend(*self.project_cross(x_BTC, memory_BSC), bias=bias)

    def attend(
        self,
        q_BHTD: Tensor,
        k_BGTD: Tensor,
        v_BGTD: Tensor,
        pattern_hook: Callable[[Tensor], Tensor] | None = None,
        bias: Tensor | None = None,
    ) -> Tensor:
        """z (B, T, H, D) from q (B, H, T, D) and k, v per key/value head (B, G, S, D) (S = T in self-attention);
        pattern_hook: applied to the attention pattern (B, H, T, S) before it weighs the values (the explicit path; an
        intervention's read or edit of the attn.pattern site); bias: added to the scores, broadcastable to
        (B, H, T, S), after the soft-cap and before the causal mask (T5's relative position bias, -inf at padded
        keys)."""
        k_BHSD, v_BHSD = self.per_query_head(k_BGTD), self.per_query_head(v_BGTD)
        if pattern_hook is not None or (self.features.softcap is not None and self.n_heads > 0):
            z_BHTD, _ = self.reference_attention(q_BHTD, k_BHSD, v_BHSD, pattern_hook, bias)
        elif self.n_heads == 0:  # pruned to no heads: z is empty, and SDPA's fused kernels refuse zero-size inputs
            z_BHTD = q_BHTD
        else:
            window, T = self.features.window, q_BHTD.shape[2]
            mask_TT = allowed_keys(T, window, q_BHTD.device) if window is not None and window < T else None
            causal = mask_TT is None and self.features.causal
            if bias is not None:  # SDPA takes one additive mask: the bias with the causal (or window) mask in it
                keep_TT = mask_TT if mask_TT is not None else allowed_keys(T, None, q_BHTD.device) if causal else None
                mask_TT = bias.to(q_BHTD.dtype)
                mask_TT = mask_TT if keep_TT is None else mask_TT.masked_fill(~keep_TT, float("-inf"))
                causal = False
            z_BHTD = F.scaled_dot_product_attention(
                q_BHTD,
                k_BHSD,
                v_BHSD,
                attn_mask=mask_TT,
                is_causal=causal,
                dropout_p=self.dropout if self.training else 0.0,
                scale=self.score_scale,
            )
        return z_BHTD.transpose(1, 2)

    def project(self, x_BTC: Tensor, at: tuple[Tensor, int] | None = None) -> tuple[Tensor, Tensor, Tensor]:
        """q (B, H, T, D), and k and v (B, H_kv, T, D) per key/value head, from one fused projection; q and k
        normalised when the model has q/k norms (over the projection before the head split, or per head), then rotated
        by their positions when the model uses rotary positions. at: None when x holds positions 0..T-1; else
        (positions (B, T), the sequences' whole length), x holding those positions of longer sequences (the suffix
        evaluator's slots, model/suffix.py: rotary angles of the whole length, as dynamic scaling reads it)."""
        B, T, _ = x_BTC.shape
        H, G, D = self.n_heads, self.n_kv_heads, self.head_dim
        q_BTX, k_BTX, v_BTX = self.qkv(x_BTC).split([H * D, G * D, G * D], dim=-1)
        if self.pos_emb is not None:  # (x + p_t) W for q and k: p_t W added, the bias already in once
            p_TC = self.pos_emb.weight[:T] if at is None else self.pos_emb.weight[at[0]]
            qk_TX = F.linear(p_TC, self.qkv.weight[: (H + G) * D])
            q_BTX, k_BTX = q_BTX + qk_TX[..., : H * D], k_BTX + qk_TX[..., H * D :]
        if self.features.qk_norm == "projection" and self.q_norm is not None:  # (a layer pruned to no heads has none)
            q_BTX, k_BTX = self.q_norm(q_BTX), self.k_norm(k_BTX)
        q_BTHD, k_BTGD = q_BTX.view(B, T, H, D), k_BTX.view(B, T, G, D)
        if self.features.qk_norm == "head":
            q_BTHD, k_BTGD = self.q_norm(q_BTHD), self.k_norm(k_BTGD)
        q_BHTD, k_BGTD = q_BTHD.transpose(1, 2), k_BTGD.transpose(1, 2)
        v_BGTD = v_BTX.view(B, T, G, D).transpose(1, 2)
        if self.rotary is not None and at is None:
            q_BHTD, k_BGTD = self.rotary(q_BHTD, k_BGTD)
        elif self.rotary is not None:
            cos_TR, sin_TR = self.rotary.angles(at[1], x_BTC.device, x_BTC.dtype)
            cos_B1TR, sin_B1TR = cos_TR[at[0]][:, None], sin_TR[at[0]][:, None]
            q_BHTD = self.rotary.rotate(q_BHTD, cos_B1TR, sin_B1TR)
            k_BGTD = self.rotary.rotate(k_BGTD, cos_B1TR, sin_B1TR)
        return q_BHTD, k_BGTD, v_BGTD

    def attend_allowed(self, q_BHSD: Tensor, k_BGKD: Tensor, v_BGKD: Tensor, allowed_B1SK: Tensor) -> Tensor:
        """z (B, S, H, D) of S queries over K keys per key/value head, allowed (broadcastable to (B, H, S, K)) saying
        which keys each query sees: the suffix evaluator's slots over the clean keys before them and their own
        (model/suffix.py)."""
        return self.attend_masked(q_BHSD, self.per_query_head(k_BGKD), self.per_query_head(v_BGKD), allowed_B1SK)

    def attend_masked(self, q_BHSD: Tensor, k_BHKD: Tensor, v_BHKD: Tensor, allowed_B1SK: Tensor) -> Tensor:
        """z (B, S, H, D) of S queries over K keys of their own head, `allowed` saying which each query sees. SDPA, or
        the reference path's arithmetic for soft-capped scores."""
        cap = self.features.softcap
        if cap is None:
            z_BHSD = F.scaled_dot_product_attention(
                q_BHSD, k_BHKD, v_BHKD, attn_mask=allowed_B1SK, scale=self.score_scale
            )
        else:  # SDPA cannot cap
            scores = (q_BHSD @ k_BHKD.transpose(-2, -1)) * self.score_scale
            scores = torch.tanh(scores / cap) * cap
            z_BHSD = scores.masked_fill(~allowed_B1SK, float("-inf")).softmax(dim=-1) @ v_BHKD
        return z_BHSD.transpose(1, 2)

    def project_cross(self, x_BTC: Tensor, memory_BSC: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Cross-attention's q (B, H, T, D) from the decoder's stream x and k, v (B, G, S, D) from the encoder's
        output: the fused projection's q rows applied to x, its k and v rows to the memory (no positions)."""
        (B, T, _), S = x_BTC.shape, memory_BSC.shape[1]
        H, G, D = self.n_heads, self.n_kv_heads, self.head_dim
        W_XC, b_X = self.qkv.weight, self.qkv.bias
        q_BTX = F.linear(x_BTC, W_XC[: H * D], None if b_X is None else b_X[: H * D])
        k_BSX, v_BSX = F.linear(memory_BSC, W_XC[H * D :], None if b_X is None else b_X[H * D :]).split(
            [G * D, G * D], -1
        )
        q_BHTD = q_BTX.view(B, T, H, D).transpose(1, 2)
        return q_BHTD, k_BSX.view(B, S, G, D).transpose(1, 2), v_BSX.view(B, S, G, D).transpose(1, 2)

    def project_inputs(self, x_BKWTC: Tensor, heads_K: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor]:
        """q, k and v (B, K, T, D) of K query heads (`heads_K`, the layer's head indices in x's order; None: all of
        them) each from its own normed inputs x[:, k, 0|1|2] (B, K, 3, T, C): head h's rows of the projection (its
        key/value head's for k and v), q/k norms per head and rotary positions (shortformer positions join q's and k's
        inputs). A q/k norm over the whole projection (OLMo 2) mixes every head's rows, so there each input runs through
        the whole projection and head h keeps its own slice. With every input the layer's normed stream this is
        `project`'s q and its k, v shared out per query head (tests/test_interventions.py)."""
        if heads_K is None:
            heads_K = torch.arange(self.n_heads, device=x_BKWTC.device)
        kv_K = self.kv_head_of[heads_K]
        if self.features.qk_norm == "projection":
            B, K, W, T, C = x_BKWTC.shape
            q_NHTD, k_NGTD, v_NGTD = self.project(x_BKWTC.reshape(B * K * W, T, C))
            D, H, G = self.head_dim, self.n_heads, self.n_kv_heads
            k = torch.arange(K, device=x_BKWTC.device)
            q_BKTD = q_NHTD.view(B, K, W, H, T, D)[:, :, 0][:, k, heads_K]
            k_BKTD = k_NGTD.view(B, K, W, G, T, D)[:, :, 1][:, k, kv_K]
            v_BKTD = v_NGTD.view(B, K, W, G, T, D)[:, :, 2][:, k, kv_K]
            return q_BKTD, k_BKTD, v_BKTD

        def one(w: int, W_KCD: Tensor, b_KD: Tensor | None) -> Tensor:
            inputs_BKTC = x_BKWTC[:, :, w]
            if w < 2 and self.pos_emb is not None:  # shortformer positions: in q's and k's inputs, not v's
                inputs_BKTC = inputs_BKTC + self.pos_emb.weight[: inputs_BKTC.shape[2]]
            out_BKTD = torch.einsum("bhtc,hcd->bhtd", inputs_BKTC, W_KCD)
            return out_BKTD if b_KD is None else out_BKTD + b_KD[:, None]

        q_BKTD = one(0, self.W_Q[heads_K], None if self.b_Q is None else self.b_Q[heads_K])
        k_BKTD = one(1, self.W_K[kv_K], None if self.b_K is None else self.b_K[kv_K])
        v_BKTD = one(2, self.W_V[kv_K], None if self.b_V is None else self.b_V[kv_K])
        if self.features.qk_norm == "head":
            q_BKTD, k_BKTD = self.q_norm(q_BKTD), self.k_norm(k_BKTD)
        if self.rotary is not None:
            q_BKTD, k_BKTD = self.rotary(q_BKTD, k_BKTD)
        return q_BKTD, k_BKTD, v_BKTD

    def heads_from_inputs(
        self,
        x_BKWTC: Tensor,
        heads_K: Tensor | None = None,
        queries: tuple[Tensor, Tensor] | None = None,
        bias: Tensor | None = None,
    ) -> Tensor:
        """z (B, T, K, D) of the K heads `project_inputs` projects from their own normed inputs (explicit softmax).
        queries: (positions (B, S), allowed (B, S, T)): z (B, S, K, D) of the queries at those positions only, each
        over the keys `allowed` marks (a suffix run's slots, model/suffix.py). bias: as in `attend`, of every head
        (queries None only)."""
        q_BKTD, k_BKTD, v_BKTD = self.project_inputs(x_BKWTC, heads_K)
        if queries is None:
            z_BKTD, _ = self.reference_attention(q_BKTD, k_BKTD, v_BKTD, bias=bias)
            return z_BKTD.transpose(1, 2)
        positions_BS, allowed_BST = queries
        index_BKSD = positions_BS[:, None, :, None].expand(-1, q_BKTD.shape[1], -1, q_BKTD.shape[-1])
        return self.attend_masked(q_BKTD.gather(2, index_BKSD), k_BKTD, v_BKTD, allowed_BST[:, None])

    def cross_heads_from_inputs(self, x_BHTC: Tensor, memory_BHWSC: Tensor) -> Tensor:
        """Cross-attention's z (B, T, H, D), query head h reading q from its own normed decoder input x[:, h] and its
        key/value head's k and v from its own copies of the encoder's output memory[:, h, 0|1] (B, H, 2, S, C): the
        circuits' per-receiver inputs. With every input the plain one this is `cross_heads` (explicit softmax)."""
        kv_H = self.kv_head_of

        def one(inputs_BHXC: Tensor, W_HCD: Tensor, b_HD: Tensor | None) -> Tensor:
            out_BHXD = torch.einsum("bhxc,hcd->bhxd", inputs_BHXC, W_HCD)
            return out_BHXD if b_HD is None else out_BHXD + b_HD[:, None]

        q_BHTD = one(x_BHTC, self.W_Q, self.b_Q)
        k_BHSD = one(memory_BHWSC[:, :, 0], self.W_K[kv_H], None if self.b_K is None else self.b_K[kv_H])
        v_BHSD = one(memory_BHWSC[:, :, 1], self.W_V[kv_H], None if self.b_V is None else self.b_V[kv_H])
        z_BHTD, _ = self.reference_attention(q_BHTD, k_BHSD, v_BHSD)
        return z_BHTD.transpose(1, 2)

    def input_projection_floats(self) -> int:
        """Floats per position and per input that `project_inputs` holds beyond a head's own q, k, v: the whole
        projection of each input where a q/k norm spans it (OLMo 2), none otherwise (memory budgets read this)."""
        if self.features.qk_norm == "projection":
            return (self.n_heads + 2 * self.n_kv_heads) * self.head_dim
        return 0

    @property
    def first_query_heads(self) -> Tensor:
        """(G,): each key/value head's first query head (a query head's k and v are its key/value head's)."""
        starts = [0]
        for size in self.kv_groups[:-1]:
            starts.append(starts[-1] + size)
        return torch.tensor(starts, dtype=torch.long, device=self.kv_head_of.device)

    def per_query_head(self, x_BGTD: Tensor) -> Tensor:
        """k or v repeated for the query heads sharing it (B, H, T, D); as it is without grouping."""
        return x_BGTD.index_select(1, self.kv_head_of) if self.grouped else x_BGTD

    def reference_attention(
        self,
        q_BHTD: Tensor,
        k_BHTD: Tensor,
        v_BHTD: Tensor,
        pattern_hook: Callable[[Tensor], Tensor] | None = None,
        bias: Tensor | None = None,
    ) -> tuple[Tensor, Tensor]:
        """The explicit softmax path: slower than SDPA, but it returns the attention pattern for analysis (after
        pattern_hook, when given: an intervention's edit of the pattern). bias as in `attend`."""
        T, cap = q_BHTD.shape[2], self.features.softcap
        scores_BHTT = (q_BHTD @ k_BHTD.transpose(-2, -1)) * self.score_scale
        if cap is not None:
            scores_BHTT = torch.tanh(scores_BHTT / cap) * cap
        if bias is not None:
            scores_BHTT = scores_BHTT + bias.to(scores_BHTT.dtype)
        if self.features.causal:
            allowed_TT = allowed_keys(T, self.features.window, q_BHTD.device)
            scores_BHTT = scores_BHTT.masked_fill(~allowed_TT, float("-inf"))
        pattern_BHTT = scores_BHTT.softmax(dim=-1)
        if pattern_hook is not None:
            pattern_BHTT = pattern_hook(pattern_BHTT)
        dropped_BHTT = F.dropout(pattern_BHTT, self.dropout, self.training)
        return dropped_BHTT @ v_BHTD, pattern_BHTT

    @property
    def score_scale(self) -> float:
        return self.features.scale if self.features.scale is not None else self.head_dim**-0.5

    @staticmethod
    def gate_z(
        z_BTHD: Tensor, gate: Tensor | None, replacement: Tensor | None = None, where: Tensor | None = None
    ) -> Tensor:
        """z_h <- g z_h + (1 - g) r_h. gate: (H,) or (B, H) in [0, 1], None for no gating (z as it is).
        replacement: broadcastable to z, i.e. (H, D), (T, H, D) or (B, T, H, D); None means zero.
        where: (B, T) in [0, 1], the positions the gate acts at (None: all); elsewhere z stays as it is."""
        if gate is None:
            return z_BTHD
        g_BTHD = gate[..., None, :, None]  # (H,) -> (1, H, 1), (B, H) -> (B, 1, H, 1); also fine with H = 0
        if where is not None:  # g at the chosen positions, 1 (no change) elsewhere
            g_BTHD = 1 - (1 - g_BTHD) * where[:, :, None, None].to(g_BTHD.dtype)
        return g_BTHD * z_BTHD if replacement is None else g_BTHD * z_BTHD + (1 - g_BTHD) * replacement

    def combine_heads(self, z_BTHD: Tensor) -> Tensor:
        """(B, T, C): the heads concatenated or summed, then the output projection."""
        B, T, H, D = z_BTHD.shape
        if self.combine == "concat":
            return self.out(z_BTHD.reshape(B, T, H * D))
        return self.out(z_BTHD.sum(dim=2))

    def select_heads(
        self, keep_H: Tensor, replacement_HD: Tensor | None = None, add_out_bias: bool = False
    ) -> "MultiHeadAttention":
        """A new module with only the heads keep_H (bool, (H,)) marks, in order, in the same dtype, device and mode.
        It equals this one with the other heads gated to 0 and replaced by replacement_HD, a constant per head (H, D)
        (None: zero ablation), whose contribution folds into the output bias. A key/value head stays while any query
        head of its group stays. The new module has an output bias when this one has, when a replacement folds, or
        when add_out_bias asks for one (a zero bias, for a model whose layers share one out_bias setting)."""
        H, G, D, C = self.n_heads, self.n_kv_heads, self.head_dim, self.d_model
        if self.features.qk_norm == "projection" and not keep_H.all():
            allowed = "cannot be pruned structurally: a q/k norm over the whole projection mixes every head's q and k"
            raise ConfigError("model.qk_norm", "projection", allowed)
        W_XC = self.qkv.weight.detach()
        keep_H = keep_H.to(W_XC.device)
        kv_of_H = self.kv_head_of.to(W_XC.device)
        keep_G = torch.zeros(G, dtype=torch.bool, device=W_XC.device).index_fill(0, kv_of_H[keep_H], True)
        kept_groups = [int((keep_H & (kv_of_H == g)).sum()) for g in range(G) if keep_G[g]]
        fold_C = None
        if replacement_HD is not None and not keep_H.all():
            W_HDC = self.W_O.detach()
            r_RD = replacement_HD.to(device=W_HDC.device, dtype=W_HDC.dtype)[~keep_H]
            fold_C = torch.einsum("rd,rdc->c", r_RD, W_HDC[~keep_H])
        has_out_bias = self.out.bias is not None
        out_bias = has_out_bias or fold_C is not None or add_out_bias
        state = {"qkv.weight": self._select_qkv_rows(W_XC, keep_H, keep_G)}
        kept_whole = ("q_norm.", "k_norm.", "pos_emb.")  # shared by the heads, or (positions) by no head in particular
        state |= {name: t for name, t in self.state_dict().items() if name.startswith(kept_whole)}
        if self.qkv.bias is not None:
            state["qkv.bias"] = self._select_qkv_rows(self.qkv.bias.detach(), keep_H, keep_G)
        W_CX = self.out.weight.detach()
        state["out.weight"] = W_CX.view(C, H, D)[:, keep_H].reshape(C, -1) if self.combine == "concat" else W_CX
        if out_bias:
            bias_C = self.out.bias.detach() if has_out_bias else W_CX.new_zeros(C)
            state["out.bias"] = bias_C if fold_C is None else bias_C + fold_C
        # Building the module draws random init values that the state overwrites; keep the caller's random stream.
        with torch.random.fork_rng(devices=[]):
            qkv_bias = self.qkv.bias is not None
            selected = MultiHeadAttention(
                C,
                sum(kept_groups),
                D,
                self.combine,
                qkv_bias,
                out_bias,
                self.dropout,
                kept_groups,
                self.rotary,
                self.features,
                self.pos_emb.num_embeddings if self.pos_emb is not None else 0,
            )
        selected.to(device=W_XC.device, dtype=W_XC.dtype).load_state_dict(state)
        return selected.train(self.training)

    def _select_qkv_rows(self, rows_X: Tensor, keep_H: Tensor, keep_G: Tensor) -> Tensor:
        """The fused projection's rows (weights (X, C) or biases (X,)) of the kept query and key/value heads."""
        kept = [self._qkv_part(rows_X, 0)[keep_H], self._qkv_part(rows_X, 1)[keep_G], self._qkv_part(rows_X, 2)[keep_G]]
        return torch.cat([t.flatten(0, 1) for t in kept])

    # Per-head views of the fused weights (they share storage and gradients with the parameters).

    @property
    def W_Q(self) -> Tensor:
        """(H, C, D): q_h = x W_Q[h] + b_Q[h] (before q/k norms and rotary positions)."""
        return self._qkv_part(self.qkv.weight, 0).transpose(1, 2)

    @property
    def W_K(self) -> Tensor:
        """(H_kv, C, D): query head h reads key/value head kv_head_of[h]; likewise W_V."""
        return self._qkv_part(self.qkv.weight, 1).transpose(1, 2)

    @property
    def W_V(self) -> Tensor:
        return self._qkv_part(self.qkv.weight, 2).transpose(1, 2)

    @property
    def b_Q(self) -> Tensor | None:
        """(H, D), or None without qkv biases; likewise b_K, b_V (H_kv, D)."""
        return None if self.qkv.bias is None else self._qkv_part(self.qkv.bias, 0)

    @property
    def b_K(self) -> Tensor | None:
        return None if self.qkv.bias is None else self._qkv_part(self.qkv.bias, 1)

    @property
    def b_V(self) -> Tensor | None:
        return None if self.qkv.bias is None else self._qkv_part(self.qkv.bias, 2)

    @property
    def W_O(self) -> Tensor:
        """(H, D, C): out = sum_h z_h W_O[h] + b_O. Under sum every head shares the same matrix."""
        W_CX = self.out.weight
        if self.combine == "concat":
            return W_CX.T.reshape(self.n_heads, self.head_dim, self.d_model)  # C spelt out: H may be 0
        return W_CX.T.expand(self.n_heads, -1, -1)

    @property
    def b_O(self) -> Tensor | None:
        """(C,), or None without an output bias."""
        return self.out.bias

    def _qkv_part(self, rows_X: Tensor, which: int) -> Tensor:
        """The q (0), k (1) or v (2) rows of the fused weight (X, C) or bias (X,), as (heads, D, C) or (heads, D)."""
        heads = [self.n_heads, self.n_kv_heads, self.n_kv_heads]
        part = rows_X.split([n * self.head_dim for n in heads])[which]
        return part.view(heads[which], self.head_dim, *rows_X.shape[1:])  # sizes spelt out: a layer may have no heads

    # Sizes for memory budgets: generous counts of floats per position, not measurements.

    def z_floats(self) -> int:
        """z of one position: H x D."""
        return self.n_heads * self.head_dim

    def activation_floats(self, seq_len: int) -> int:
        """What the layer holds per position while it runs: q, k, v, z, its gated and combined copies, and the
        attention scores over seq_len keys; with grouping also k and v before they are shared out, with rotary
        positions the rotated q and k and a temporary of each."""
        kv_floats = 2 * self.n_kv_heads * self.head_dim
        floats = 6 * self.z_floats() + self.n_heads * seq_len
        if self.grouped:
            floats += kv_floats
        if self.rotary is not None:
            floats += 2 * self.z_floats() + kv_floats
        return floats


def fuse_qkv(parts: list[tuple[Tensor, Tensor | None]]) -> tuple[Tensor, Tensor | None]:
    """Separate q, k, v projections (weight, bias) as MultiHeadAttention.qkv's fused rows
    [q: H*D | k: H_kv*D | v: H_kv*D], the layout this module alone knows (checkpoint converters build it with this)."""
    weight = torch.cat([w for w, _ in parts])
    biases = [b for _, b in parts]
    if all(b is None for b in biases):
        return weight, None
    if any(b is None for b in biases):
        raise ValueError("q, k and v projections must all have biases or none")
    return weight, torch.cat(biases)
