"""What an encoder's heads do, read off their attention patterns over sentences whose dependency arcs and word
frequencies are known (Voita et al. 2019, section 4). Every measure looks at where each query token's attention is
largest (its argmax key), over the real tokens of each sentence (padding is neither a query nor a key):

- confidence: the mean over query tokens of the largest attention weight (Voita's "confidence");
- positional: the relative offset (in -OFFSETS..OFFSETS) the argmax lands on most often, and the share of the
  queries that have a token at that offset whose argmax is it; a head is positional when that offset is -1 or +1
  and the share at least 0.9 (Voita's "at least 90% of the time ... a specific relative position, in practice -1 or
  +1");
- syntactic: for each relation and direction, the accuracy: the share of its query tokens whose argmax is a token
  they are linked to: "dep" (each dependent of that relation, looking for its head) and "head" (each token with
  at least one dependent of that relation, looking for any of them); against a positional baseline, the best
  accuracy a fixed offset reaches on the same queries (Voita's "most frequent relative position"); a head is
  syntactic for a relation when its accuracy beats the baseline by at least 0.1 (Voita's 10%);
- rare words: the share of queries whose argmax is the sentence's least frequent token (its largest rank; any of
  them on a tie), beside chance: the mean over queries of (rarest tokens) / (tokens)."""

from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch
from torch import Tensor

from headcount.data.translation import RELATIONS, TranslationPairs, relations

OFFSETS = 3  # offsets -3..3 are scored (0 too: a head may attend to its own token)
POSITIONAL_SHARE = 0.9
SYNTACTIC_GAIN = 0.1
DIRECTIONS = ("dep", "head")


@dataclass
class SentenceFacts:
    """Per sentence of B, S positions: lengths (B,), heads (B, S) each token's head index (-1 root; any value past
    the length), relations (B, S) each token's relation index (-1: none), ranks (B, S) frequency ranks (larger:
    rarer)."""

    lengths: np.ndarray
    heads: np.ndarray
    relations: np.ndarray
    ranks: np.ndarray
    relation_names: tuple[str, ...]

    @property
    def valid(self) -> np.ndarray:
        return np.arange(self.heads.shape[1])[None] < self.lengths[:, None]


def argmax_keys(patterns_BHSS: Tensor, facts: SentenceFacts) -> tuple[np.ndarray, np.ndarray]:
    """Each query's argmax key over the sentence's tokens, (B, H, S) int, and its weight, (B, H, S) float64."""
    valid = torch.as_tensor(facts.valid, device=patterns_BHSS.device)
    masked = patterns_BHSS.double().masked_fill(~valid[:, None, None, :], -1.0)
    top, where = masked.max(dim=-1)
    return where.cpu().numpy(), top.cpu().numpy()


def layer_roles(patterns_BHSS: Tensor, facts: SentenceFacts, layer: int) -> tuple[pd.DataFrame, pd.DataFrame]:
    """One layer's heads: a row per head (layer, head, confidence, position_offset, position_share, positional,
    rare_share, rare_chance, and the best syntactic relation: syntactic_relation, syntactic_direction,
    syntactic_accuracy, syntactic_baseline, syntactic), and the syntactic table, a row per head, relation and
    direction (accuracy, baseline, queries)."""
    keys_BHS, top_BHS = argmax_keys(patterns_BHSS, facts)
    valid = facts.valid
    n_heads = keys_BHS.shape[1]
    syntax = syntactic_table(keys_BHS, facts, layer)
    rows = []
    for head in range(n_heads):
        keys = keys_BHS[:, head]
        offset, share = positional_share(keys, facts)
        rare, chance = rare_word_share(keys, facts)
        mine = syntax[syntax["head"] == head]
        best = mine.assign(gain=mine.accuracy - mine.baseline).sort_values("gain", ascending=False).iloc[0]
        rows.append(
            {
                "layer": layer,
                "head": head,
                "confidence": float(top_BHS[:, head][valid].mean()),
                "position_offset": offset,
                "position_share": share,
                "positional": abs(offset) == 1 and share >= POSITIONAL_SHARE,
                "rare_share": rare,
                "rare_chance": chance,
                "syntactic_relation": best.relation,
                "syntactic_direction": best.direction,
                "syntactic_accuracy": float(best.accuracy),
                "syntactic_baseline": float(best.baseline),
                "syntactic": bool(best.accuracy - best.baseline >= SYNTACTIC_GAIN),
            }
        )
    return pd.DataFrame(rows), syntax


def positional_share(keys_BS: np.ndarray, facts: SentenceFacts) -> tuple[int, float]:
    """The offset the argmax lands on most often (the mode), and the share of the queries with a token at that
    offset whose argmax is it (a sentence's first token has no -1)."""
    positions = np.arange(keys_BS.shape[1])[None]
    hits, shares = {}, {}
    for offset in range(-OFFSETS, OFFSETS + 1):
        has = facts.valid & (positions + offset >= 0) & (positions + offset < facts.lengths[:, None])
        on = (keys_BS == positions + offset) & has
        hits[offset], shares[offset] = int(on.sum()), float(on.sum() / max(has.sum(), 1))
    mode = max(hits, key=hits.get)
    return mode, shares[mode]


def rare_word_share(keys_BS: np.ndarray, facts: SentenceFacts) -> tuple[float, float]:
    valid = facts.valid
    ranks = np.where(valid, facts.ranks, np.iinfo(np.int64).min)
    rarest_BS = ranks == ranks.max(axis=1, keepdims=True)
    hit = np.take_along_axis(rarest_BS, keys_BS, axis=1)
    chance = np.broadcast_to((rarest_BS.sum(axis=1) / facts.lengths)[:, None], valid.shape)
    return float(hit[valid].mean()), float(chance[valid].mean())


def linked_keys(facts: SentenceFacts, relation: int, direction: str) -> tuple[np.ndarray, np.ndarray]:
    """For one relation and direction: which positions are its queries (B, S) bool, and which keys each query is
    linked to (B, S, S) bool."""
    n, s = facts.heads.shape
    is_rel = facts.valid & (facts.relations == relation)
    link = np.zeros((n, s, s), dtype=bool)  # link[b, dependent, its head]
    rows, deps = np.nonzero(is_rel)
    link[rows, deps, facts.heads[rows, deps]] = True
    if direction == "head":
        link = link.transpose(0, 2, 1)  # link[b, head, each of its dependents]
    return link.any(axis=2), link


def syntactic_table(keys_BHS: np.ndarray, facts: SentenceFacts, layer: int) -> pd.DataFrame:
    """A row per head, relation and direction: accuracy (argmax on a linked key), baseline (the best fixed offset's
    accuracy on the same queries) and the number of queries."""
    n, n_heads, s = keys_BHS.shape
    positions = np.arange(s)
    rows = []
    for relation, name in enumerate(facts.relation_names):
        for direction in DIRECTIONS:
            queries, link = linked_keys(facts, relation, direction)
            if not queries.any():
                continue
            baseline = 0.0
            for offset in range(-s + 1, s):
                target = positions + offset
                inside = (target >= 0) & (target < s)
                hit = np.zeros((n, s), dtype=bool)
                hit[:, inside] = link[:, positions[inside], target[inside]]
                baseline = max(baseline, float(hit[queries].mean()))
            for head in range(n_heads):
                on_link = np.take_along_axis(link, keys_BHS[:, head, :, None], axis=2)[..., 0]
                rows.append(
                    {
                        "layer": layer,
                        "head": head,
                        "relation": name,
                        "direction": direction,
                        "accuracy": float(on_link[queries].mean()),
                        "baseline": baseline,
                        "queries": int(queries.sum()),
                    }
                )
    return pd.DataFrame(rows)


def sentence_facts(pairs: TranslationPairs) -> SentenceFacts:
    """The generated translation task's source sentences as SentenceFacts."""
    return SentenceFacts(pairs.source_lengths, pairs.heads, relations(pairs), pairs.ranks, RELATIONS)
