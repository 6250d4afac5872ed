"""Multi-head causal self-attention: the one place heads are defined.

Per head h (DESIGN.md): z_h = softmax(q_h k_h^T / sqrt(head_dim) + causal) v_h. A gate g and a replacement r act on z
before heads combine, z_h <- g z_h + (1 - g) r_h, and heads combine by concatenation (one W_o slice per head) or by
summation (one W_o shared by all heads, as in the first Transformer). Tensor names carry their shape:
B batch, T positions, C model width, H heads, D head width.
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
        self.n_heads, self.head_dim, self.combine, self.dropout = n_heads, head_dim, combine, dropout
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
        """gate: (H,) or (B, H) in [0, 1]. replacement: broadcastable to z, i.e. (H, D), (T, H, D) or (B, T, H, D);
        None means zero. cache: if given, receives "z" (B, T, H, D) and, with need_pattern, "pattern" (B, H, T, T)."""
        B, T, _ = x_BTC.shape
        H, D = self.n_heads, self.head_dim
        q_BHTD, k_BHTD, v_BHTD = self.qkv(x_BTC).view(B, T, 3, H, D).permute(2, 0, 3, 1, 4)
        if need_pattern:
            z_BHTD, pattern_BHTT = self.reference_attention(q_BHTD, k_BHTD, v_BHTD)
            cache["pattern"] = pattern_BHTT
        elif H == 0:  # pruned to no heads: z is empty, and SDPA's fused kernels refuse zero-size inputs
            z_BHTD = v_BHTD
        else:
            z_BHTD = F.scaled_dot_product_attention(
                q_BHTD, k_BHTD, v_BHTD, is_causal=True, dropout_p=self.dropout if self.training else 0.0
            )
        z_BTHD = z_BHTD.transpose(1, 2)
        if cache is not None:
            cache["z"] = z_BTHD
        if gate is not None:
            g_BTHD = gate[..., None, :, None]  # (H,) -> (1, H, 1), (B, H) -> (B, 1, H, 1); also fine with H = 0
            z_BTHD = g_BTHD * z_BTHD if replacement is None else g_BTHD * z_BTHD + (1 - g_BTHD) * replacement
        if self.combine == "concat":
            return self.out(z_BTHD.reshape(B, T, H * D))
        return self.out(z_BTHD.sum(dim=2))

    def reference_attention(self, q_BHTD: Tensor, k_BHTD: Tensor, v_BHTD: Tensor) -> tuple[Tensor, Tensor]:
        """The explicit softmax path: slower than SDPA, but it returns the attention pattern for analysis."""
        T = q_BHTD.shape[2]
        scores_BHTT = (q_BHTD @ k_BHTD.transpose(-2, -1)) * self.head_dim**-0.5
        causal_TT = torch.ones(T, T, dtype=torch.bool, device=q_BHTD.device).tril()
        pattern_BHTT = scores_BHTT.masked_fill(~causal_TT, float("-inf")).softmax(dim=-1)
        dropped_BHTT = F.dropout(pattern_BHTT, self.dropout, self.training)
        return dropped_BHTT @ v_BHTD, pattern_BHTT

    def head_output_weights(self) -> Tensor:
        """W_o per head, (H, D, C); under sum every head shares the same matrix."""
        W_CX = self.out.weight
        if self.combine == "concat":
            return W_CX.T.reshape(self.n_heads, self.head_dim, W_CX.shape[0])  # C spelt out: H may be 0
        return W_CX.T.expand(self.n_heads, -1, -1)
