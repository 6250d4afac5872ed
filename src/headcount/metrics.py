"""Next-token loss and accuracy on the positions an example's loss_mask marks.

A split's loss is per token: the sum over every target token of the split divided by the number of targets, with the
sums kept in float64. Training's validation and test numbers (metrics.json) and the ablation baseline both use this
definition, so the two "baseline" losses of a run agree to float rounding; a mean of per-batch means would weight a
batch with few targets like one with many.
"""

import torch
from torch import Tensor
from torch.nn import functional as F


def token_nll_and_correct(logits_BTV: Tensor, input_ids_BT: Tensor) -> tuple[Tensor, Tensor]:
    """Per-target negative log-likelihood and hit (argmax == target), both (B, T-1), in float32 or wider.

    Position t of the result scores the prediction of input_ids[:, t + 1], which loss_mask[:, t + 1] marks."""
    logits_BSV = logits_BTV[:, :-1]
    if logits_BSV.dtype in (torch.float16, torch.bfloat16):
        logits_BSV = logits_BSV.float()
    targets_BS = input_ids_BT[:, 1:]
    nll_BS = F.cross_entropy(logits_BSV.transpose(1, 2), targets_BS, reduction="none")
    correct_BS = (logits_BSV.argmax(dim=-1) == targets_BS).to(nll_BS.dtype)
    return nll_BS, correct_BS


def masked_loss_and_accuracy(logits_BTV: Tensor, input_ids_BT: Tensor, loss_mask_BT: Tensor) -> tuple[Tensor, Tensor]:
    """Mean loss and accuracy over the marked targets of a batch (the training loss)."""
    nll_BS, correct_BS = token_nll_and_correct(logits_BTV, input_ids_BT)
    mask_BS = loss_mask_BT[:, 1:].to(nll_BS.dtype)
    count = mask_BS.sum().clamp_min(1)
    return (nll_BS * mask_BS).sum() / count, (correct_BS * mask_BS).sum() / count


def masked_token_sums(logits_BTV: Tensor, input_ids_BT: Tensor, loss_mask_BT: Tensor) -> Tensor:
    """(3,) float64: the summed loss, the number of hits and the number of targets over the marked targets of a batch.
    Add these over a split's batches (and processes), then divide with `per_token`."""
    nll_BS, correct_BS = token_nll_and_correct(logits_BTV, input_ids_BT)
    mask_BS = loss_mask_BT[:, 1:].double()
    return torch.stack([(nll_BS.double() * mask_BS).sum(), (correct_BS.double() * mask_BS).sum(), mask_BS.sum()])


def per_token(sums: Tensor) -> tuple[Tensor, Tensor]:
    """Loss and accuracy per target token from summed `masked_token_sums`."""
    nll, correct, count = sums.unbind()
    count = count.clamp_min(1)
    return nll / count, correct / count
