"""Rotary position embeddings (Su et al. 2021), as Llama and GPT-NeoX apply them to q and k, and their scalings.

The first `dims` dimensions of each head turn in pairs (i, i + dims/2), the "rotate half" layout Hugging Face's
checkpoints use, pair i by the angle position * inv_freq[i]; the rest pass through (GPT-NeoX's rotary_pct). The
frequencies are theta^(-2i / dims), or a scaling of them (`RopeScalingConfig.type`, transformers' rope_type, each
computed here with the same float32 operations as transformers' modeling_rope_utils, so the bits agree): linear
divides them by the factor; llama3 divides the low ones and ramps between; yarn mixes interpolated and extrapolated
ones and scales cos and sin by its attention factor; dynamic (NTK) raises the base once a sequence is longer than
original_n_ctx. transformers' dynamic rotary keeps the frequencies of the longest sequence it has seen (until one
shorter than the original context resets it); headcount computes them from each pass's own length T, which is what
transformers computes on a fresh model and for any pass at least as long as every earlier one.
The angles are computed in float32 and then cast, as transformers does, so converted models match it at every dtype.
Positions start at 0: headcount always runs whole sequences.
"""

import math

import torch
from torch import Tensor, nn

from headcount.config.model import RopeScalingConfig, RopeType


def inverse_frequencies(dims: int, theta: float, scaling: RopeScalingConfig, n_ctx: int) -> tuple[Tensor, float]:
    """(dims / 2,) float32 frequencies for sequences up to the original context, and the cos/sin scale."""
    exponents = torch.arange(0, dims, 2, dtype=torch.int64).float() / dims
    inv_freq = 1.0 / (theta**exponents)
    kind, factor = scaling.type, scaling.factor
    original = scaling.original_n_ctx or n_ctx
    if kind == RopeType.linear:
        return inv_freq / factor, 1.0
    if kind == RopeType.llama3:
        return llama3_frequencies(inv_freq, scaling, original), 1.0
    if kind == RopeType.yarn:
        return yarn_frequencies(dims, theta, scaling, original), yarn_attention_factor(scaling)
    return inv_freq, 1.0  # default, and dynamic up to the original context


def llama3_frequencies(inv_freq: Tensor, s: RopeScalingConfig, original: int) -> Tensor:
    low_freq_wavelen, high_freq_wavelen = original / s.low_freq_factor, original / s.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / s.factor, inv_freq)
    smooth = (original / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor)
    smoothed = (1 - smooth) * scaled / s.factor + smooth * scaled
    medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(medium, smoothed, scaled)


def yarn_attention_factor(s: RopeScalingConfig) -> float:
    if s.attention_factor is not None:
        return float(s.attention_factor)
    return 1.0 if s.factor <= 1 else 0.1 * math.log(s.factor) + 1.0


def yarn_frequencies(dims: int, theta: float, s: RopeScalingConfig, original: int) -> Tensor:
    def correction_dim(rotations: float) -> float:
        return (dims * math.log(original / (rotations * 2 * math.pi))) / (2 * math.log(theta))

    low, high = correction_dim(s.beta_fast), correction_dim(s.beta_slow)
    if s.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dims - 1)
    if low == high:
        high += 0.001  # as transformers: no division by zero
    ramp = torch.clamp((torch.arange(dims // 2, dtype=torch.float32) - low) / (high - low), 0, 1)
    pos_freqs = theta ** (torch.arange(0, dims, 2).float() / dims)
    extrapolation = 1 - ramp
    return (1.0 / (s.factor * pos_freqs)) * (1 - extrapolation) + (1.0 / pos_freqs) * extrapolation


def dynamic_frequencies(dims: int, theta: float, factor: float, original: int, T: int) -> Tensor:
    """NTK's frequencies for a sequence of T > original positions, with transformers' tensor arithmetic."""
    seq_len = torch.maximum(torch.tensor(T), torch.tensor(original))
    base = theta * ((factor * seq_len / original) - (factor - 1)) ** (dims / (dims - 2))
    return 1.0 / (base ** (torch.arange(0, dims, 2, dtype=torch.int64).float() / dims))


class Rotary(nn.Module):
    def __init__(self, dims: int, theta: float, scaling: RopeScalingConfig | None = None, n_ctx: int = 0):
        """scaling: the rotary scaling (None: none); n_ctx: the context original_n_ctx defaults to."""
        super().__init__()
        self.dims, self.theta = dims, theta
        self.scaling = scaling or RopeScalingConfig()
        self.original_n_ctx = self.scaling.original_n_ctx or n_ctx
        # The frequencies on the CPU, as transformers computes its buffer: the same bits on every device.
        self.inv_freq_R2, self.cos_sin_scale = inverse_frequencies(dims, theta, self.scaling, n_ctx)

    def forward(self, q_BHTD: Tensor, k_BGTD: Tensor) -> tuple[Tensor, Tensor]:
        """q and k rotated by their positions (any number of heads each)."""
        cos_TR, sin_TR = self.angles(q_BHTD.shape[2], q_BHTD.device, q_BHTD.dtype)
        return self.rotate(q_BHTD, cos_TR, sin_TR), self.rotate(k_BGTD, cos_TR, sin_TR)

    def frequencies(self, T: int) -> Tensor:
        if self.scaling.type == RopeType.dynamic and T > self.original_n_ctx:
            return dynamic_frequencies(self.dims, self.theta, self.scaling.factor, self.original_n_ctx, T)
        return self.inv_freq_R2

    def angles(self, T: int, device: torch.device, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        """cos and sin (T, dims), each frequency twice (for both halves)."""
        angle_TR2 = torch.arange(T, device=device).float()[:, None] * self.frequencies(T).to(device)[None]
        angle_TR = torch.cat((angle_TR2, angle_TR2), dim=-1)
        cos_TR, sin_TR = angle_TR.cos(), angle_TR.sin()
        if self.cos_sin_scale != 1.0:
            cos_TR, sin_TR = cos_TR * self.cos_sin_scale, sin_TR * self.cos_sin_scale
        return cos_TR.to(dtype), sin_TR.to(dtype)

    def rotate(self, x_BHTD: Tensor, cos_TR: Tensor, sin_TR: Tensor) -> Tensor:
        R = self.dims
        x_rot, x_pass = x_BHTD[..., :R], x_BHTD[..., R:]
        half = R // 2
        rotated_half = torch.cat((-x_rot[..., half:], x_rot[..., :half]), dim=-1)
        rotated = x_rot * cos_TR + rotated_half * sin_TR
        return rotated if x_pass.shape[-1] == 0 else torch.cat((rotated, x_pass), dim=-1)

    def extra_repr(self) -> str:
        scaling = "" if self.scaling.type == RopeType.default else f", scaling={self.scaling.type}"
        return f"dims={self.dims}, theta={self.theta}{scaling}"
