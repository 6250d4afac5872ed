"""Rotary position embeddings (Su et al. 2021), as Llama and GPT-NeoX apply them to q and k.

The first `dims` dimensions of each head turn in pairs (i, i + dims/2), the "rotate half" layout Hugging Face's
checkpoints use, pair i by the angle position * theta^(-2i / dims); the rest pass through (GPT-NeoX's rotary_pct).
The angles are computed in float32 and then cast, as transformers does, so converted models match it at every dtype.
Positions start at 0: headcount always runs whole sequences.
"""

import torch
from torch import Tensor, nn


class Rotary(nn.Module):
    def __init__(self, dims: int, theta: float):
        super().__init__()
        self.dims, self.theta = dims, theta

    def forward(self, q_BHTD: Tensor, k_BGTD: Tensor) -> tuple[Tensor, Tensor]:
        """q and k rotated by their positions (any number of heads each)."""
        cos_TR, sin_TR = self.angles(q_BHTD.shape[2], q_BHTD.device, q_BHTD.dtype)
        return self.rotate(q_BHTD, cos_TR, sin_TR), self.rotate(k_BGTD, cos_TR, sin_TR)

    def angles(self, T: int, device: torch.device, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        """cos and sin (T, dims), each frequency twice (for both halves)."""
        # The frequencies on the CPU, as transformers computes its buffer: the same bits on every device.
        inv_freq_R2 = 1.0 / (self.theta ** (torch.arange(0, self.dims, 2, dtype=torch.float) / self.dims))
        angle_TR2 = torch.arange(T, device=device).float()[:, None] * inv_freq_R2.to(device)[None]
        angle_TR = torch.cat((angle_TR2, angle_TR2), dim=-1)
        return angle_TR.cos().to(dtype), angle_TR.sin().to(dtype)

    def rotate(self, x_BHTD: Tensor, cos_TR: Tensor, sin_TR: Tensor) -> Tensor:
        R = self.dims
        x_rot, x_pass = x_BHTD[..., :R], x_BHTD[..., R:]
        half = R // 2
        rotated_half = torch.cat((-x_rot[..., half:], x_rot[..., :half]), dim=-1)
        rotated = x_rot * cos_TR + rotated_half * sin_TR
        return rotated if x_pass.shape[-1] == 0 else torch.cat((rotated, x_pass), dim=-1)

    def extra_repr(self) -> str:
        return f"dims={self.dims}, theta={self.theta}"
