"""Sequence-to-sequence batches, their teacher-forced loss, and greedy decoding for an EncoderDecoder.

Teacher forcing: the decoder reads the target shifted right, y' = [start, y_1, ..., y_n], and position t predicts
y'_{t+1}; the loss is the mean of -log p(y_{t+1} | y'_{<=t}, x) over the target tokens (docs/DESIGN.md,
"Encoder-decoders"). A batch says this as every batch of headcount says it: `input_ids` the decoder's stream y' and
`loss_mask` marking the target tokens in it, so the loss is metrics.py's next-token loss on the positions loss_mask
marks, conditioned on `src_ids` (with `src_mask` False at padded source positions).

Greedy decoding encodes the source once and extends each target by the argmax of the decoder's last position until
every sequence has produced `eos_id` or `max_new_tokens` tokens; positions after a sequence's eos hold `pad_id`, as
transformers' generate leaves them. The decoder reruns over the whole prefix at each step (no key/value cache): the
same operations as the teacher-forced pass, so a decoded sequence fed back scores as it decoded (tested).
"""

import torch
from torch import Tensor
from torch.nn import functional as F

from headcount.model.encoder_decoder import EncoderDecoder, Gates, StackIntervention


def seq2seq_batch(sources: list[list[int]], targets: list[list[int]], start_id: int, pad_id: int) -> dict:
    """Right-padded src_ids and src_mask, the decoder's input_ids [start, y...] and loss_mask on the y tokens."""
    S, T = max(map(len, sources)), 1 + max(map(len, targets))
    batch = {
        "src_ids": torch.full((len(sources), S), pad_id, dtype=torch.long),
        "src_mask": torch.zeros(len(sources), S, dtype=torch.bool),
        "input_ids": torch.full((len(sources), T), pad_id, dtype=torch.long),
        "loss_mask": torch.zeros(len(sources), T, dtype=torch.long),
    }
    for i, (src, tgt) in enumerate(zip(sources, targets)):
        batch["src_ids"][i, : len(src)] = torch.tensor(src, dtype=torch.long)
        batch["src_mask"][i, : len(src)] = True
        batch["input_ids"][i, : 1 + len(tgt)] = torch.tensor([start_id, *tgt], dtype=torch.long)
        batch["loss_mask"][i, 1 : 1 + len(tgt)] = 1
    return batch


def seq2seq_logits(model: EncoderDecoder, batch: dict, gates: Gates | None = None) -> Tensor:
    """The teacher-forced logits (B, T, V) of a seq2seq batch."""
    return model(batch["src_ids"], batch["input_ids"], gates=gates, src_keep=batch.get("src_mask"))


def seq2seq_loss(model: EncoderDecoder, batch: dict, gates: Gates | None = None) -> Tensor:
    """The mean cross-entropy over the target tokens loss_mask marks, teacher-forced (in at least float32; the
    training loss, metrics.masked_loss_and_accuracy's on these logits)."""
    logits_BTV = seq2seq_logits(model, batch, gates)[:, :-1]
    marked_BT = batch["loss_mask"][:, 1:].bool()
    logits_NV = logits_BTV[marked_BT]
    logits_NV = logits_NV.to(torch.promote_types(logits_NV.dtype, torch.float32))
    return F.cross_entropy(logits_NV, batch["input_ids"][:, 1:][marked_BT])


@torch.no_grad()
def greedy_decode(
    model: EncoderDecoder,
    src_BS: Tensor,
    start_id: int,
    max_new_tokens: int,
    eos_id: int | None = None,
    pad_id: int | None = None,
    src_keep: Tensor | None = None,
    gates: Gates | None = None,
    intervention: StackIntervention | None = None,
) -> Tensor:
    """(B, 1 + n) token ids: start_id, then up to max_new_tokens argmax tokens per source (n the longest decoded);
    after a sequence's eos_id, pad_id (default eos_id). gates: a dict by kind (EncoderDecoder.forward), applied at
    every step, so an ablated model decodes as ablated; intervention: a user's hooks at the stack sites in their
    place, the encoder's once and the decoder's at every step (over the whole prefix decoded so far)."""
    gates = model.check_kinds(gates, "gates")
    enc, dec = (None, None) if intervention is None else (intervention.enc, intervention.dec)
    memory_BSC = model.encode(src_BS, gates.get("enc"), src_keep=src_keep, intervention=enc)
    out_BT = torch.full((src_BS.shape[0], 1), start_id, dtype=torch.long, device=src_BS.device)
    done_B = torch.zeros(src_BS.shape[0], dtype=torch.bool, device=src_BS.device)
    fill = eos_id if pad_id is None else pad_id
    for _ in range(max_new_tokens):
        logits_BTV = model.decode(out_BT, memory_BSC, src_keep, gates.get("dec"), gates.get("cross"), intervention=dec)
        next_B = logits_BTV[:, -1].argmax(-1)
        if eos_id is not None:
            next_B = torch.where(done_B, torch.full_like(next_B, fill), next_B)
            done_B = done_B | (next_B == eos_id)
        out_BT = torch.cat([out_BT, next_B[:, None]], dim=1)
        if eos_id is not None and bool(done_B.all()):
            break
    return out_BT
