"""L0 gates on an encoder-decoder's encoder heads (Voita et al. 2019, section 6), trained on the translation loss:
the hard-concrete sampling and expected-L0 penalty of l0_gates.py, one log_alpha per encoder head, the model's weights
frozen (as l0_gates.py, which explains why), one gate sample per sentence, loss = mean teacher-forced cross-entropy of
the reference tokens + penalty * expected L0. Besides the final gates it records when each head closed: the share of
the steps after which its gate was still more likely open than closed, P(gate > 0) > 1/2 (the head's survival)."""

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from headcount.ablation.methods.l0_gates import expected_open, sample_gates
from headcount.config.ablation import L0GatesConfig
from headcount.model.encoder_decoder import EncoderDecoder


@dataclass
class EncoderGates:
    penalty: float
    log_alpha_LH: Tensor
    keep_LH: Tensor  # bool: P(gate > 0) > 1/2 at the end
    survival_LH: np.ndarray  # share of the steps after which the head was still kept
    task_loss: list[float]  # per step
    expected_l0: list[float]  # per step


def train_encoder_gates(
    model: EncoderDecoder, batches: list[dict[str, Tensor]], cfg: L0GatesConfig, penalty: float
) -> EncoderGates:
    """Gates on model's encoder heads under the fixed penalty, cfg.steps Adam steps cycling through batches (each
    with src_ids, src_mask, input_ids, loss_mask as as_seq2seq gives them). The model's requires_grad flags and mode
    are restored afterwards."""
    param = next(model.parameters())
    dtype = torch.promote_types(param.dtype, torch.float32)
    log_alpha_LH = torch.full(model.head_kinds["enc"], cfg.log_alpha_init, dtype=dtype, device=param.device)
    log_alpha_LH.requires_grad_(True)
    optimizer = torch.optim.Adam([log_alpha_LH], lr=cfg.lr)
    generator = torch.Generator(device=param.device).manual_seed(cfg.seed)
    open_steps_LH = torch.zeros(log_alpha_LH.shape, dtype=torch.float64)
    losses, l0s = [], []
    flags, was_training = [p.requires_grad for p in model.parameters()], model.training
    model.requires_grad_(False).eval()
    try:
        for step in range(cfg.steps):
            batch = {name: a.to(param.device) for name, a in batches[step % len(batches)].items()}
            gates_BLH = sample_gates(log_alpha_LH, len(batch["src_ids"]), cfg, generator).to(param.dtype)
            logits = model(batch["src_ids"], batch["input_ids"], gates={"enc": gates_BLH}, src_keep=batch["src_mask"])
            task_loss = sequence_loss(logits, batch)
            expected_l0 = expected_open(log_alpha_LH, cfg).sum()
            optimizer.zero_grad()
            (task_loss + penalty * expected_l0).backward()
            optimizer.step()
            open_steps_LH += (expected_open(log_alpha_LH.detach(), cfg) > 0.5).double().cpu()
            losses.append(task_loss.item())
            l0s.append(expected_l0.item())
    finally:
        for p, flag in zip(model.parameters(), flags):
            p.requires_grad_(flag)
        model.train(was_training)
    log_alpha_LH = log_alpha_LH.detach().cpu()
    keep_LH = expected_open(log_alpha_LH, cfg) > 0.5
    survival = (open_steps_LH / max(cfg.steps, 1)).numpy()
    return EncoderGates(penalty, log_alpha_LH, keep_LH, survival, losses, l0s)


def sequence_loss(logits_BTV: Tensor, batch: dict[str, Tensor]) -> Tensor:
    """Mean cross-entropy of the marked target tokens (position t predicts input_ids t + 1)."""
    logits = logits_BTV[:, :-1].to(torch.promote_types(logits_BTV.dtype, torch.float32))
    losses = F.cross_entropy(logits.transpose(1, 2), batch["input_ids"][:, 1:], reduction="none")
    marks = batch["loss_mask"][:, 1:].to(losses.dtype)
    return (losses * marks).sum() / marks.sum()
