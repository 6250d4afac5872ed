"""How well a model translates the generated translation task (data/translation.py), with some heads gated: BLEU of
its greedy translations against the references (sacrebleu, each token id a word, so no tokenizer stands between the
ids and the score) and its teacher-forced loss on the references, the two scores Michel et al. 2019 pruned by.

Here the model reads one sequence, BOS source SEP target EOS (a decoder-only translator: `as_sequences`); greedy
decoding writes the most likely token after SEP, then after that, until EOS or the target's longest length. A causal
model's position t never reads later positions, so a batch decodes as each sentence decodes alone, right padding and
unfinished neighbours included (tested)."""

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from headcount.data.synthetic import BOS, SEP
from headcount.data.translation import EOS, MAX_TARGET, SEQUENCE, TranslationPairs, as_sequences
from headcount.errors import ConfigError
from headcount.model.transformer import Transformer

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
    model: Transformer, pairs: TranslationPairs, gates: Tensor | None = None, batch_size: int = 256
) -> list[list[int]]:
    """Each source sentence's greedy translation (without EOS), the model reading BOS source SEP and what it wrote."""
    device = next(model.parameters()).device
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
            logits = model(ids, gates=gates)
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


@torch.no_grad()
def reference_loss(model: Transformer, pairs: TranslationPairs, gates: Tensor | None = None, batch_size: int = 256):
    """Mean cross-entropy (nats) of each reference token and EOS given the source and the reference before it."""
    device = next(model.parameters()).device
    ids, mask = (torch.as_tensor(a, device=device) for a in as_sequences(pairs, SEQUENCE))
    total, count = torch.zeros((), dtype=torch.float64), 0
    for start in range(0, len(ids), batch_size):
        batch, marks = ids[start : start + batch_size], mask[start : start + batch_size, 1:]
        logits = model(batch, gates=gates)[:, :-1]
        logits = logits.to(torch.promote_types(logits.dtype, torch.float32))  # half precision scored in float32
        losses = F.cross_entropy(logits.transpose(1, 2), batch[:, 1:], reduction="none")
        total += losses[marks].double().sum().cpu()
        count += int(marks.sum())
    return float(total / count)


def translation_quality(
    model: Transformer, pairs: TranslationPairs, gates: Tensor | None = None, batch_size: int = 256
) -> TranslationQuality:
    hypotheses, refs = greedy_translations(model, pairs, gates, batch_size), references(pairs)
    exact = float(np.mean([h == r for h, r in zip(hypotheses, refs)]))
    return TranslationQuality(corpus_bleu(hypotheses, refs), reference_loss(model, pairs, gates, batch_size), exact)
