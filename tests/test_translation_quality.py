"""BLEU and loss of a model's translations of the generated task (ablation/methods/translation_quality.py): sacrebleu's
corpus BLEU against hand computations, greedy decoding by an oracle model that knows the references (BLEU 100, each
sentence exact, loss ln 2 by construction) and by one that drops each sentence's last word, and a real model's batch
decoding equal to each sentence decoded alone."""

import math

import numpy as np
import pytest
import torch
from torch import nn

from headcount.ablation.methods.translation_quality import (
    corpus_bleu,
    greedy_translations,
    reference_loss,
    references,
    translation_quality,
    until_eos,
)
from headcount.config.model import AttentionConfig, ModelConfig
from headcount.data.synthetic import SEP
from headcount.data.translation import EOS, SEQUENCE, translation_pairs
from headcount.model.transformer import Transformer

VOCAB = 512


def test_bleu_by_hand():
    assert corpus_bleu([[1, 2, 3, 4]], [[1, 2, 3, 4]]) == pytest.approx(100)
    # all n-grams right, one word short: the brevity penalty alone, exp(1 - 6 / 5)
    assert corpus_bleu([[1, 2, 3, 4, 5]], [[1, 2, 3, 4, 5, 6]]) == pytest.approx(100 * math.exp(-0.2))
    # one wrong word: precisions 4/5, 2/4, 1/3 and no 4-gram, which sacrebleu's default smoothing counts as 1/(2 x 2)
    assert corpus_bleu([[1, 2, 3, 9, 5]], [[1, 2, 3, 4, 5]]) == pytest.approx(
        100 * (4 / 5 * 2 / 4 * 1 / 3 * 1 / 4) ** 0.25
    )
    # a corpus pools its n-gram counts (not a mean of sentence scores)
    assert corpus_bleu([[1, 2, 3, 4], [5, 6, 7]], [[1, 2, 3, 4], [5, 6, 8]]) == pytest.approx(
        100 * (6 / 7 * 4 / 5 * 2 / 3 * 1 / 1) ** 0.25
    )
    assert until_eos([4, 5, EOS, 6]) == [4, 5] and until_eos([4, 5]) == [4, 5]


class Oracle(nn.Module):
    """Reads BOS source SEP written-so-far and puts probability 1/2 on the reference's next token (the rest spread
    evenly): greedy decoding must then write the reference, and the loss is ln 2 at every target. drop_last: the
    reference without its last word."""

    def __init__(self, pairs, drop_last=False):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(1))  # gives the module a device
        self.table = {}
        for row in range(len(pairs.source)):
            s = pairs.source_lengths[row]
            target = list(pairs.target[row, : pairs.target_lengths[row]])
            self.table[tuple(pairs.source[row, :s])] = target[:-2] + [EOS] if drop_last else target
        self.gates_seen = []

    def forward(self, ids, intervention=None):  # the gates come as the one forward's intervention (model/)
        hooks = {} if intervention is None else intervention.hooks
        self.gates_seen += [hook.gates for site_hooks in hooks.values() for hook in site_hooks]
        n, length = ids.shape
        logits = torch.full((n, length, VOCAB), math.log(0.5 / (VOCAB - 1)), dtype=torch.float64)
        for row in range(n):
            sep = ids[row].tolist().index(SEP)
            target = self.table[tuple(ids[row, 1:sep].tolist())]
            for k, token in enumerate(target):
                if sep + k < length:
                    logits[row, sep + k, token] = math.log(0.5)
        return logits


@pytest.fixture(scope="module")
def pairs():
    return translation_pairs(np.random.default_rng(5), 40, VOCAB)


def test_an_oracle_translates_exactly(pairs):
    oracle = Oracle(pairs)
    gates = torch.ones(2, 4)
    quality = translation_quality(oracle, pairs, gates, batch_size=16)
    assert quality.bleu == pytest.approx(100) and quality.exact == 1.0
    assert quality.loss == pytest.approx(math.log(2), rel=1e-12)
    assert all(g is gates for g in oracle.gates_seen)
    assert greedy_translations(oracle, pairs, batch_size=7) == references(pairs)


def test_an_oracle_without_last_words_scores_what_sacrebleu_says(pairs):
    short = greedy_translations(Oracle(pairs, drop_last=True), pairs, batch_size=16)
    refs = references(pairs)
    assert short == [r[:-1] for r in refs]
    hyp_len, ref_len = sum(map(len, short)), sum(map(len, refs))
    # each sentence's n-grams all match, but there are fewer: precisions 1, brevity penalty exp(1 - ref / hyp)
    assert corpus_bleu(short, refs) == pytest.approx(100 * math.exp(1 - ref_len / hyp_len))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_batched_decoding_is_each_sentence_alone(pairs, dtype):
    torch.manual_seed(0)
    model = Transformer(ModelConfig(n_layers=2, d_model=32, vocab_size=VOCAB, n_ctx=SEQUENCE, attn=AttentionConfig(4)))
    model = model.to(dtype).eval()
    subset = translation_pairs(np.random.default_rng(6), 6, VOCAB)
    together = greedy_translations(model, subset, batch_size=6)
    for row in range(6):
        alone = type(subset)(*(getattr(subset, f)[row : row + 1] for f in subset.__dataclass_fields__))
        assert greedy_translations(model, alone) == together[row : row + 1]
    # the loss is a mean over target tokens, whatever the batches
    assert reference_loss(model, subset, batch_size=6) == pytest.approx(reference_loss(model, subset, batch_size=4))
