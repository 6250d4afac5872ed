"""T5's relative position bias: b_h(bucket(s - t)) added to head h's score of query t for key s, one learned table
(buckets x heads) per stack, computed once and shared by the stack's layers (Raffel et al. 2020).

Buckets (transformers' `_relative_position_bucket`): with n buckets, bidirectional attention (an encoder) gives half
to each direction, keys after the query in the upper half; causal attention (a decoder) reads only d = t - s >= 0.
Within a direction's n' buckets, distances below n'/2 have a bucket each; a larger distance d goes to
n'/2 + floor(ln(d / (n'/2)) / ln(max_distance / (n'/2)) * (n' - n'/2)), capped at n' - 1.
"""

import math

import torch
from torch import Tensor, nn


def relative_bucket(distance_TS: Tensor, bidirectional: bool, n_buckets: int, max_distance: int) -> Tensor:
    """The bucket (long) of each relative position s - t."""
    buckets_TS = torch.zeros_like(distance_TS)
    if bidirectional:
        n_buckets //= 2
        buckets_TS = buckets_TS + (distance_TS > 0).long() * n_buckets
        distance_TS = distance_TS.abs()
    else:
        distance_TS = -distance_TS.clamp(max=0)
    exact = n_buckets // 2
    # float32 as transformers computes it, so the bucket edges fall where T5's do
    log_ratio_TS = torch.log(distance_TS.float().clamp(min=1) / exact) / math.log(max_distance / exact)
    large_TS = (exact + (log_ratio_TS * (n_buckets - exact)).long()).clamp(max=n_buckets - 1)
    return buckets_TS + torch.where(distance_TS < exact, distance_TS, large_TS)


class RelativePositionBias(nn.Module):
    """The bias (1, H, T, S) of one stack: `rel_emb` (buckets, H), checkpoints store it under that name."""

    def __init__(self, n_heads: int, n_buckets: int, max_distance: int, bidirectional: bool):
        super().__init__()
        self.rel_emb = nn.Embedding(n_buckets, n_heads)
        self.n_buckets, self.max_distance, self.bidirectional = n_buckets, max_distance, bidirectional

    def forward(self, T: int, S: int | None = None) -> Tensor:
        device = self.rel_emb.weight.device
        S = T if S is None else S
        distance_TS = torch.arange(S, device=device)[None, :] - torch.arange(T, device=device)[:, None]
        buckets_TS = relative_bucket(distance_TS, self.bidirectional, self.n_buckets, self.max_distance)
        return self.rel_emb(buckets_TS).permute(2, 0, 1)[None]
