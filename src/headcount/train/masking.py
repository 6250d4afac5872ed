"""The masked-LM objective's corruption for an encoder (model.causal=false), shared by training and the scans.

BERT's recipe (Devlin et al. 2019, headcount.model.mlm.mask_tokens): each position is chosen with probability 0.15;
a chosen one becomes the mask token (80%), a random token (10%) or stays (10%), and is scored on its original token.
A sequence with no position chosen gets its first draw's position, so every sequence has a score point.

The mask token: a checkpoint's tokenizer's (BERT's [MASK]); for a model trained here, the id just past the data's
own vocabulary (bytes: 256), which the data never produces, so model.vocab_size must exceed it. Random tokens are
drawn from the data's vocabulary (a checkpoint's: the model's).
"""

from dataclasses import asdict, dataclass

import torch
from omegaconf import DictConfig
from torch import Tensor

from headcount.config import typed
from headcount.config.data import DataConfig, data_vocab_size
from headcount.errors import ConfigError
from headcount.model.mlm import IGNORE, mask_tokens, masked_lm_loss

MASK_SHARE = 0.15


@dataclass(frozen=True)
class Masking:
    mask_id: int
    random_below: int  # random replacements are drawn from [0, random_below)
    share: float = MASK_SHARE

    def record(self) -> dict:
        return asdict(self)

    def corrupt(self, ids_BT: Tensor, generator: torch.Generator | None = None) -> tuple[Tensor, Tensor]:
        """(inputs, labels) as mask_tokens, with at least one position chosen per sequence."""
        inputs_BT, labels_BT = mask_tokens(ids_BT, self.mask_id, self.random_below, self.share, generator)
        empty_B = (labels_BT == IGNORE).all(1)
        if bool(empty_B.any()):  # the sequence's first position then: a deterministic choice, scored like the rest
            labels_BT[empty_B, 0] = ids_BT[empty_B, 0]
            inputs_BT[empty_B, 0] = self.mask_id
        return inputs_BT, labels_BT


def masking_for(config: DictConfig, vocab_size: int) -> Masking:
    """The corruption for a run's config and its model's vocabulary (ConfigError when there is no mask token)."""
    pretrained = config.model.get("pretrained")
    if pretrained:
        from headcount.pretrained.run_config import checkpoint_tokenizer

        mask_id = checkpoint_tokenizer(pretrained).tokenizer.mask_token_id
        if mask_id is None:
            raise ConfigError("model.pretrained", pretrained, "an encoder's masked-LM points need a mask token")
        return Masking(int(mask_id), vocab_size)
    data_vocab = data_vocab_size(typed(config.data, DataConfig))
    if data_vocab is None or data_vocab >= vocab_size:
        allowed = f"must be at least the data's vocabulary + 1 ({(data_vocab or 0) + 1}) on an encoder: the mask token"
        raise ConfigError("model.vocab_size", vocab_size, allowed + " is the id after the data's own")
    return Masking(data_vocab, data_vocab)


def masked_points(examples: dict[str, Tensor], masking: Masking, seed: int) -> dict[str, Tensor]:
    """An encoder's evaluation examples: input_ids corrupted by a generator seeded with `seed` (the same masks every
    time), scored at the chosen positions on their original tokens (score_mask, answer_ids: the task batch format
    the metrics read, ablation/engine/metrics.py's Targets)."""
    ids_NT = examples["input_ids"]
    inputs_NT, labels_NT = masking.corrupt(ids_NT.cpu(), torch.Generator().manual_seed(seed))
    chosen_NT = labels_NT != IGNORE
    return {"input_ids": inputs_NT, "score_mask": chosen_NT, "answer_ids": torch.where(chosen_NT, labels_NT, 0)}


def masked_lm_sums(logits_BTV: Tensor, labels_BT: Tensor) -> Tensor:
    """(3,) float64, as metrics.masked_token_sums: summed loss, hits and count over the chosen positions."""
    chosen_BT = labels_BT != IGNORE
    logits_NV = logits_BTV[chosen_BT].to(torch.promote_types(logits_BTV.dtype, torch.float32))
    answer_N = labels_BT[chosen_BT]
    nll_N = torch.nn.functional.cross_entropy(logits_NV, answer_N, reduction="none")
    hits_N = logits_NV.argmax(-1) == answer_N
    return torch.stack([nll_N.double().sum(), hits_N.double().sum(), torch.tensor(len(answer_N), dtype=torch.float64)])


def masked_lm_loss_and_accuracy(logits_BTV: Tensor, labels_BT: Tensor) -> tuple[Tensor, Tensor]:
    """The training loss (model.mlm.masked_lm_loss: the mean cross-entropy at the chosen positions) and accuracy."""
    chosen_BT = labels_BT != IGNORE
    accuracy = (logits_BTV[chosen_BT].argmax(-1) == labels_BT[chosen_BT]).float().mean()
    return masked_lm_loss(logits_BTV, labels_BT), accuracy
