"""How well a model translates the generated translation task (data/translation.py), with some heads gated: BLEU of
its greedy translations against the references (sacrebleu, each token id a word, so no tokenizer stands between the
ids and the score) and its teacher-forced loss on the references, the two scores Michel et al. 2019 pruned by.

A decoder-only translator reads one sequence, BOS source SEP target EOS (`as_sequences`); greedy decoding writes the
most likely token after SEP, then after that, until EOS or the target's longest length. A causal model's position t
never reads later positions, so a batch decodes as each sentence decodes alone, right padding and unfinished
neighbours included (tested). An encoder-decoder reads the source in its encoder (padding masked) and decodes from
BOS (`as_seq2seq`, model/seq2seq.py's greedy_decode); its gates are a dict by kind (enc, dec, cross)."""

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from headcount.data.synthetic import BOS, SEP
from headcount.data.translation import (
    EOS,
    MAX_SOURCE,
    MAX_TARGET,
    SEQUENCE,
    TranslationPairs,
    as_seq2seq,
    as_sequences,
)
from headcount.errors import ConfigError
from headcount.model.encoder_decoder import EncoderDecoder
from headcount.model.intervention import gated
from headcount.model.seq2seq import greedy_decode
from headcount.model.transformer import Transformer

Model = Transformer | EncoderDecoder

INSTALL = "pip install 'headcount[translation]'"


@dataclass(frozen=True)
class TranslationQuality:
    bleu: float  # corpus BLEU of the greedy translations, 0-100
    loss: float  # mean cross-entropy of the reference's tokens and EOS, teacher-forced (nats)
    exact: float  # share of sentences translated exactly


def corpus_bleu(hypotheses: Sequence[Sequence[int]], references: Sequence[Sequence[int]]) -> float:
    """sacrebleu's corpus BLEU over token ids as words, with its defaults: n-grams up to 4 pooled over the corpus,
    the brevity penalty, and exponential smoothing of an order without a match (1/2, then 1/4, ... of a match)."""
    try:
        from sacrebleu.metrics import BLEU
    except ImportError as error:
        raise ConfigError("finding", "translation", f"BLEU needs sacrebleu: {INSTALL}") from error
    if len(hypotheses) != len(references) or not references:
        raise ValueError(f"{len(hypotheses)} hypotheses for {len(references)} references")
    as_words = [" ".join(map(str, ids)) for ids in hypotheses]
    return float(BLEU(tokenize="none").corpus_score(as_words, [[" ".join(map(str, ids)) for ids in references]]).score)


def until_eos(ids: Sequence[int]) -> list[int]:
    """The tokens before the first EOS (all of them when there is none)."""
    ids = [int(i) for i in ids]
    return ids[: ids.index(EOS)] if EOS in ids else ids


def references(pairs: TranslationPairs) -> list[list[int]]:
    return [until_eos(row) for row in pairs.target]


@torch.no_grad()
def greedy_translations(
    model: Model, pairs: TranslationPairs, gates: Tensor | dict | None = None, batch_size: int = 256
) -> list[list[int]]:
    """Each source sentence's greedy translation (without EOS), the model reading BOS source SEP and what it wrote
    (an encoder-decoder: the source, and BOS and what it wrote)."""
    device = next(model.parameters()).device
    if isinstance(model, EncoderDecoder):
        return seq2seq_translations(model, pairs, gates, batch_size)
    out: list[list[int]] = []
    for start in range(0, len(pairs.source), batch_size):
        rows = slice(start, start + batch_size)
        lengths = torch.as_tensor(pairs.source_lengths[rows], device=device)
        n = len(lengths)
        ids = torch.full((n, SEQUENCE), BOS, dtype=torch.long, device=device)
        ids[:, 1 : 1 + pairs.source.shape[1]] = torch.as_tensor(pairs.source[rows], device=device)
        at = lengths + 1  # SEP's position; the first written token goes after it
        ids[torch.arange(n), at] = SEP
        done = torch.zeros(n, dtype=torch.bool, device=device)
        written = torch.zeros(n, dtype=torch.long, device=device)
        for _ in range(MAX_TARGET):
            logits = decoder_logits(model, ids, gates)
            token = logits[torch.arange(n), at].argmax(-1)
            live = ~done
            at = at + live.long()
            ids[torch.arange(n)[live], at[live]] = token[live]
            written += live.long()
            done |= token == EOS
            if bool(done.all()):
                break
        for row in range(n):
            begin = int(lengths[row]) + 2
            out.append(until_eos(ids[row, begin : begin + int(written[row])].tolist()))
    return out


def seq2seq_translations(
    model: EncoderDecoder, pairs: TranslationPairs, gates: dict | None, batch_size: int
) -> list[list[int]]:
    device = next(model.parameters()).device
    out: list[list[int]] = []
    for start in range(0, len(pairs.source), batch_size):
        rows = slice(start, start + batch_size)
        src = torch.as_tensor(pairs.source[rows], device=device)
        keep = (
            torch.arange(MAX_SOURCE, device=device)[None]
            < torch.as_tensor(pairs.source_lengths[rows], device=device)[:, None]
        )
        ids = greedy_decode(model, src, BOS, MAX_TARGET, eos_id=EOS, pad_id=BOS, src_keep=keep, gates=gates)
        out.extend(until_eos(row[1:]) for row in ids.tolist())
    return out


def teacher_forced_logits(model: Model, columns: dict[str, Tensor], gates) -> Tensor:
    """(B, T, V) logits over the input_ids columns: a decoder's own, or an encoder-decoder's given src_ids."""
    if isinstance(model, EncoderDecoder):
        return model(columns["src_ids"], columns["input_ids"], gates=gates, src_keep=columns["src_mask"])
    return decoder_logits(model, columns["input_ids"], gates)


def decoder_logits(model: Transformer, ids_BT: Tensor, gates: Tensor | None) -> Tensor:
    """A decoder's logits with its heads gated through the one forward's intervention (None: the plain model)."""
    return model(ids_BT) if gates is None else model(ids_BT, gated(gates))


def loss_columns(model: Model, pairs: TranslationPairs) -> dict[str, np.ndarray]:
    """The pairs as the model reads them (as_seq2seq or as_sequences)."""
    if isinstance(model, EncoderDecoder):
        return as_seq2seq(pairs, max(MAX_SOURCE, MAX_TARGET + 1))
    return dict(zip(("input_ids", "loss_mask"), as_sequences(pairs, SEQUENCE)))


@torch.no_grad()
def reference_loss(model: Model, pairs: TranslationPairs, gates: Tensor | dict | None = None, batch_size: int = 256):
    """Mean cross-entropy (nats) of each reference token and EOS given the source and the reference before it."""
    device = next(model.parameters()).device
    columns = {name: torch.as_tensor(a, device=device) for name, a in loss_columns(model, pairs).items()}
    total, count = torch.zeros((), dtype=torch.float64), 0
    for start in range(0, len(columns["input_ids"]), batch_size):
        batch = {name: a[start : start + batch_size] for name, a in columns.items()}
        marks = batch["loss_mask"][:, 1:]
        logits = teacher_forced_logits(model, batch, gates)[:, :-1]
        logits = logits.to(torch.promote_types(logits.dtype, torch.float32))  # half precision scored in float32
        losses = F.cross_entropy(logits.transpose(1, 2), batch["input_ids"][:, 1:], reduction="none")
        total += losses[marks].double().sum().cpu()
        count += int(marks.sum())
    return float(total / count)


def translation_quality(
    model: Model, pairs: TranslationPairs, gates: Tensor | dict | None = None, batch_size: int = 256
) -> TranslationQuality:
    hypotheses, refs = greedy_translations(model, pairs, gates, batch_size), references(pairs)
    exact = float(np.mean([h == r for h, r in zip(hypotheses, refs)]))
    return TranslationQuality(corpus_bleu(hypotheses, refs), reference_loss(model, pairs, gates, batch_size), exact)
