"""The normalisations the families use: LayerNorm (GPT-2, GPT-NeoX), RMSNorm (Llama) and Gemma's (1 + w) RMSNorm."""

import torch
from torch import Tensor, nn

from headcount.config.model import ModelConfig, Norm


class RMSNorm(nn.Module):
    """x / sqrt(mean(x^2) + eps) * weight, computed in at least float32 and cast back before the weight, as Llama's
    reference code does (so half-precision models match it; float64 stays float64). plus_one: Gemma's form,
    x / rms(x) * (1 + weight), the gain applied in at least float32 before the cast back as Gemma's code does; its
    weight starts at 0 (the identity gain)."""

    def __init__(self, d_model: int, eps: float, plus_one: bool = False):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(d_model) if plus_one else torch.ones(d_model))
        self.eps, self.plus_one = eps, plus_one

    def forward(self, x_BTC: Tensor) -> Tensor:
        x32_BTC = x_BTC.to(torch.promote_types(x_BTC.dtype, torch.float32))
        normed_BTC = x32_BTC * torch.rsqrt(x32_BTC.pow(2).mean(-1, keepdim=True) + self.eps)
        if self.plus_one:
            return (normed_BTC * (1.0 + self.weight.to(normed_BTC.dtype))).to(x_BTC.dtype)
        return self.weight * normed_BTC.to(x_BTC.dtype)

    def gain(self) -> Tensor:
        """What the normalised x is multiplied by: weight, or 1 + weight."""
        return 1.0 + self.weight if self.plus_one else self.weight

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, eps={self.eps}" + (", plus_one" if self.plus_one else "")


def frozen_norm(norm: nn.Module, reference_NC: Tensor):
    """The norm as a linear map, its scale taken from the stream `reference_NC` it normalised (each row's): what a
    component c of that stream contributes to the normed output, c's share of it without the bias. LayerNorm:
    (c - mean(c)) / sigma * weight; RMSNorm: c / rms * weight. Summed over the components of a stream, plus the bias, it
    gives the norm of the stream exactly."""
    ref = reference_NC.to(torch.promote_types(reference_NC.dtype, torch.float32))
    if isinstance(norm, RMSNorm):
        scale_N1 = torch.rsqrt(ref.pow(2).mean(-1, keepdim=True) + norm.eps).to(reference_NC.dtype)
        return lambda c_NXC: c_NXC * scale_N1.view(-1, *[1] * (c_NXC.ndim - 2), 1) * norm.gain()
    scale_N1 = torch.rsqrt(ref.var(-1, unbiased=False, keepdim=True) + norm.eps).to(reference_NC.dtype)
    return lambda c_NXC: (
        (c_NXC - c_NXC.mean(-1, keepdim=True)) * scale_N1.view(-1, *[1] * (c_NXC.ndim - 2), 1) * (norm.weight)
    )


def make_norm(cfg: ModelConfig, width: int | None = None) -> nn.Module:
    """model.norm over `width` features (default d_model)."""
    width = width or cfg.d_model
    if cfg.norm in (Norm.rmsnorm, Norm.rmsnorm_plus_one):
        return RMSNorm(width, cfg.norm_eps, plus_one=cfg.norm == Norm.rmsnorm_plus_one)
    return nn.LayerNorm(width, eps=cfg.norm_eps)
