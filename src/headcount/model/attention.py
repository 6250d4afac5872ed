"""Multi-head causal self-attention: the one place heads are defined.

Every operation on heads lives here, and everything else (the block, the ablation evaluator, structural pruning)
calls these rather than re-deriving the weight layout:

- `heads`: project to per-head q, k, v (`project`), then attend, z_h = softmax(q_h k_h^T / sqrt(head_dim) + causal)
  v_h, by SDPA or, when the attention pattern is wanted, by the explicit reference path (`reference_attention`).
- `gate_z`: a gate g and a replacement r act on z before heads combine, z_h <- g z_h + (1 - g) r_h.
- `combine_heads`: concatenation (one W_o slice per head) or summation (one W_o shared by all heads, as in the first
  Transformer), then the output projection.
- `select_heads`: structural pruning, a new module with only the kept heads; a removed head's constant replacement
  r_h W_o^h is the same at every position, so it folds into the output bias.
- Per-head weight views in TransformerLens's layout: W_Q, W_K, W_V (H, C, D), W_O (H, D, C) and their biases.
- `activation_floats` / `z_floats`: what a pass holds per position, for memory budgets.

The parameters are one fused `qkv` Linear whose output rows are laid out (3, H, D) (q of every head, then k, then v)
and one `out` Linear; checkpoints store them under those names. Tensor names carry their shape: B batch, T positions,
C model width, H heads, D head width.
"""

import warnings

import torch
import torch.nn.functional as F
from torch import Tensor, nn


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
    ):
        super().__init__()
        self.d_model, self.n_heads, self.head_dim = d_model, n_heads, head_dim
        self.combine, self.dropout = combine, dropout
        with warnings.catch_warnings():
            # A layer structurally pruned to zero heads has empty projections; initialising them is a harmless no-op.
            warnings.filterwarnings("ignore", "Initializing zero-element tensors is a no-op")
            self.qkv = nn.Linear(d_model, 3 * n_heads * head_dim, bias=qkv_bias)
            # concat: W_o is (H*D) x C, head h owns rows h*D:(h+1)*D. sum: W_o is D x C, shared by every head.
            self.out = nn.Linear(n_heads * head_dim if combine == "concat" else head_dim, d_model, bias=out_bias)

    def forward(
        self,
        x_BTC: Tensor,
        gate: Tensor | None = None,
        replacement: Tensor | None = None,
        cache: dict | None = None,
        need_pattern: bool = False,
    ) -> Tensor:
        """The layer's output (B, T, C): heads, gated, combined. Arguments as in `heads` and `gate_z`."""
        return self.combine_heads(self.gate_z(self.heads(x_BTC, cache, need_pattern), gate, replacement))

    def heads(self, x_BTC: Tensor, cache: dict | None = None, need_pattern: bool = False) -> Tensor:
        """z (B, T, H, D). cache: if given, receives "z" and, with need_pattern, "pattern" (B, H, T, T)."""
        q_BHTD, k_BHTD, v_BHTD = self.project(x_BTC)
        if need_pattern:
            z_BHTD, pattern_BHTT = self.reference_attention(q_BHTD, k_BHTD, v_BHTD)
            cache["pattern"] = pattern_BHTT
        elif self.n_heads == 0:  # pruned to no heads: z is empty, and SDPA's fused kernels refuse zero-size inputs
            z_BHTD = v_BHTD
        else:
            z_BHTD = F.scaled_dot_product_attention(
                q_BHTD, k_BHTD, v_BHTD, is_causal=True, dropout_p=self.dropout if self.training else 0.0
            )
        z_BTHD = z_BHTD.transpose(1, 2)
        if cache is not None:
            cache["z"] = z_BTHD
        return z_BTHD

    def project(self, x_BTC: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """q, k, v per head, each (B, H, T, D), from one fused projection."""
        B, T, _ = x_BTC.shape
        return self.qkv(x_BTC).view(B, T, 3, self.n_heads, self.head_dim).permute(2, 0, 3, 1, 4)

    def reference_attention(self, q_BHTD: Tensor, k_BHTD: Tensor, v_BHTD: Tensor) -> tuple[Tensor, Tensor]:
        """The explicit softmax path: slower than SDPA, but it returns the attention pattern for analysis."""
        T = q_BHTD.shape[2]
        scores_BHTT = (q_BHTD @ k_BHTD.transpose(-2, -1)) * self.head_dim**-0.5
        causal_TT = torch.ones(T, T, dtype=torch.bool, device=q_BHTD.device).tril()
        pattern_BHTT = scores_BHTT.masked_fill(~causal_TT, float("-inf")).softmax(dim=-1)
        dropped_BHTT = F.dropout(pattern_BHTT, self.dropout, self.training)
        return dropped_BHTT @ v_BHTD, pattern_BHTT

    @staticmethod
    def gate_z(z_BTHD: Tensor, gate: Tensor | None, replacement: Tensor | None = None) -> Tensor:
        """z_h <- g z_h + (1 - g) r_h. gate: (H,) or (B, H) in [0, 1], None for no gating (z as it is).
        replacement: broadcastable to z, i.e. (H, D), (T, H, D) or (B, T, H, D); None means zero."""
        if gate is None:
            return z_BTHD
        g_BTHD = gate[..., None, :, None]  # (H,) -> (1, H, 1), (B, H) -> (B, 1, H, 1); also fine with H = 0
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
        (None: zero ablation), whose contribution folds into the output bias. The new module has an output bias when
        this one has, when a replacement folds, or when add_out_bias asks for one (a zero bias, for a model whose
        layers share one out_bias setting)."""
        H, D, C = self.n_heads, self.head_dim, self.d_model
        W_XC = self.qkv.weight.detach()
        keep_H = keep_H.to(W_XC.device)
        fold_C = None
        if replacement_HD is not None and not keep_H.all():
            W_HDC = self.W_O.detach()
            r_RD = replacement_HD.to(device=W_HDC.device, dtype=W_HDC.dtype)[~keep_H]
            fold_C = torch.einsum("rd,rdc->c", r_RD, W_HDC[~keep_H])
        has_out_bias = self.out.bias is not None
        out_bias = has_out_bias or fold_C is not None or add_out_bias
        state = {"qkv.weight": W_XC.view(3, H, D, C)[:, keep_H].reshape(-1, C)}
        if self.qkv.bias is not None:
            state["qkv.bias"] = self.qkv.bias.detach().view(3, H, D)[:, keep_H].reshape(-1)
        W_CX = self.out.weight.detach()
        state["out.weight"] = W_CX.view(C, H, D)[:, keep_H].reshape(C, -1) if self.combine == "concat" else W_CX
        if out_bias:
            bias_C = self.out.bias.detach() if has_out_bias else W_CX.new_zeros(C)
            state["out.bias"] = bias_C if fold_C is None else bias_C + fold_C
        n_kept = int(keep_H.sum())
        # Building the module draws random init values that the state overwrites; keep the caller's random stream.
        with torch.random.fork_rng(devices=[]):
            selected = MultiHeadAttention(C, n_kept, D, self.combine, self.qkv.bias is not None, out_bias, self.dropout)
        selected.to(device=W_XC.device, dtype=W_XC.dtype).load_state_dict(state)
        return selected.train(self.training)

    # Per-head views of the fused weights (they share storage and gradients with the parameters).

    @property
    def W_Q(self) -> Tensor:
        """(H, C, D): q_h = x W_Q[h] + b_Q[h]."""
        return self._qkv_weight_3HDC()[0].transpose(1, 2)

    @property
    def W_K(self) -> Tensor:
        return self._qkv_weight_3HDC()[1].transpose(1, 2)

    @property
    def W_V(self) -> Tensor:
        return self._qkv_weight_3HDC()[2].transpose(1, 2)

    @property
    def b_Q(self) -> Tensor | None:
        """(H, D), or None without qkv biases; likewise b_K, b_V."""
        return None if self.qkv.bias is None else self.qkv.bias.view(3, self.n_heads, self.head_dim)[0]

    @property
    def b_K(self) -> Tensor | None:
        return None if self.qkv.bias is None else self.qkv.bias.view(3, self.n_heads, self.head_dim)[1]

    @property
    def b_V(self) -> Tensor | None:
        return None if self.qkv.bias is None else self.qkv.bias.view(3, self.n_heads, self.head_dim)[2]

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

    def _qkv_weight_3HDC(self) -> Tensor:
        return self.qkv.weight.view(3, self.n_heads, self.head_dim, self.d_model)

    # Sizes for memory budgets: generous counts of floats per position, not measurements.

    def z_floats(self) -> int:
        """z of one position: H x D."""
        return self.n_heads * self.head_dim

    def activation_floats(self, seq_len: int) -> int:
        """What the layer holds per position while it runs: q, k, v, z, its gated and combined copies, and the
        attention scores over seq_len keys."""
        return 6 * self.z_floats() + self.n_heads * seq_len
