"""The two normalisations the families use: LayerNorm (GPT-2, GPT-NeoX) and RMSNorm (Llama)."""

import torch
from torch import Tensor, nn

from headcount.config.model import ModelConfig, Norm


class RMSNorm(nn.Module):
    """x / sqrt(mean(x^2) + eps) * weight, computed in at least float32 and cast back before the weight, as Llama's
    reference code does (so half-precision models match it; float64 stays float64)."""

    def __init__(self, d_model: int, eps: float):
        super().__init__()
        self.weight, self.eps = nn.Parameter(torch.ones(d_model)), eps

    def forward(self, x_BTC: Tensor) -> Tensor:
        x32_BTC = x_BTC.to(torch.promote_types(x_BTC.dtype, torch.float32))
        normed_BTC = x32_BTC * torch.rsqrt(x32_BTC.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * normed_BTC.to(x_BTC.dtype)

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, eps={self.eps}"


def frozen_norm(norm: nn.Module, reference_NC: Tensor):
    """The norm as a linear map, its scale taken from the stream `reference_NC` it normalised (each row's): what a
    component c of that stream contributes to the normed output, c's share of it without the bias. LayerNorm:
    (c - mean(c)) / sigma * weight; RMSNorm: c / rms * weight. Summed over the components of a stream, plus the bias, it
    gives the norm of the stream exactly."""
    ref = reference_NC.to(torch.promote_types(reference_NC.dtype, torch.float32))
    if isinstance(norm, RMSNorm):
        scale_N1 = torch.rsqrt(ref.pow(2).mean(-1, keepdim=True) + norm.eps).to(reference_NC.dtype)
        return lambda c_NXC: c_NXC * scale_N1.view(-1, *[1] * (c_NXC.ndim - 2), 1) * norm.weight
    scale_N1 = torch.rsqrt(ref.var(-1, unbiased=False, keepdim=True) + norm.eps).to(reference_NC.dtype)
    return lambda c_NXC: (
        (c_NXC - c_NXC.mean(-1, keepdim=True)) * scale_N1.view(-1, *[1] * (c_NXC.ndim - 2), 1) * (norm.weight)
    )


def make_norm(cfg: ModelConfig) -> nn.Module:
    if cfg.norm == Norm.rmsnorm:
        return RMSNorm(cfg.d_model, cfg.norm_eps)
    return nn.LayerNorm(cfg.d_model, eps=cfg.norm_eps)
