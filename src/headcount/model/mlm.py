"""BERT's masked-LM head and objective.

The head: the unembedding reads norm(act(x W_t + b_t)), a dense layer, the model's activation and a norm (BERT's
"transform"; width model.d_embed, so ELECTRA's generator ties it to its narrower embeddings), and adds a bias per
token. The objective: a share of the positions is chosen; of those, 80% are replaced by the mask token, 10% by a
random token and 10% kept (Devlin et al. 2019), and the loss is the mean cross-entropy over the chosen positions only.
"""

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from headcount.config.model import Activation, ModelConfig, embed_width
from headcount.model.norm import make_norm

IGNORE = -100  # the label of a position the loss skips (cross_entropy's ignore_index, transformers' convention)


class MaskedLMTransform(nn.Module):
    """norm(act(dense(x))): (B, T, d_model) -> (B, T, d_embed)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        width = embed_width(cfg)
        self.dense, self.norm = nn.Linear(cfg.d_model, width), make_norm(cfg, width)
        self.approximate = "tanh" if cfg.mlp_act == Activation.gelu_tanh else "none"

    def forward(self, x_BTC: Tensor) -> Tensor:
        return self.norm(F.gelu(self.dense(x_BTC), approximate=self.approximate))


def mask_tokens(
    idx_BT: Tensor, mask_id: int, vocab_size: int, share: float = 0.15, generator: torch.Generator | None = None
) -> tuple[Tensor, Tensor]:
    """(inputs, labels): BERT's corruption of idx. Each position is chosen with probability `share`; a chosen one is
    replaced by mask_id (80%), a uniform random token (10%) or kept (10%); labels hold the original token at chosen
    positions and IGNORE elsewhere."""
    draw_BT = torch.rand(idx_BT.shape, generator=generator, device=idx_BT.device)
    how_BT = torch.rand(idx_BT.shape, generator=generator, device=idx_BT.device)
    random_BT = torch.randint(0, vocab_size, idx_BT.shape, generator=generator, device=idx_BT.device)
    chosen_BT = draw_BT < share
    inputs_BT = torch.where(chosen_BT & (how_BT < 0.8), torch.full_like(idx_BT, mask_id), idx_BT)
    inputs_BT = torch.where(chosen_BT & (how_BT >= 0.8) & (how_BT < 0.9), random_BT, inputs_BT)
    return inputs_BT, torch.where(chosen_BT, idx_BT, torch.full_like(idx_BT, IGNORE))


def masked_lm_loss(logits_BTV: Tensor, labels_BT: Tensor) -> Tensor:
    """Mean cross-entropy over the positions whose label is not IGNORE (computed in at least float32)."""
    logits = logits_BTV.flatten(0, 1).to(torch.promote_types(logits_BTV.dtype, torch.float32))
    return F.cross_entropy(logits, labels_BT.flatten(), ignore_index=IGNORE)
