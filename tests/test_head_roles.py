"""Voita et al. 2019's head roles (ablation/methods/head_roles.py) read off hand-made attention patterns over the
generated translation task's sentences, whose arcs and ranks the generator knows: a previous-token head is positional
(offset -1, share 1), a head that attends along the arcs is syntactic above the position baseline, a head on the
rarest word is a rare-word head, and numbers on a two-sentence example equal a hand count."""

import numpy as np
import pytest
import torch

from headcount.ablation.methods.head_roles import SentenceFacts, layer_roles, sentence_facts
from headcount.data.translation import MAX_SOURCE, ROOT, translation_pairs


@pytest.fixture(scope="module")
def facts():
    return sentence_facts(translation_pairs(np.random.default_rng(2), 300, 512))


def one_hot(keys_BS: np.ndarray, lengths: np.ndarray) -> torch.Tensor:
    """(B, 1, S, S) patterns putting all of each query's attention on keys_BS[b, q] (padding queries: on 0)."""
    b, s = keys_BS.shape
    keys = np.where(np.arange(s)[None] < lengths[:, None], keys_BS, 0)
    pattern = torch.zeros(b, s, s, dtype=torch.float64)
    pattern.scatter_(2, torch.as_tensor(keys)[..., None], 1.0)
    return pattern[:, None]


def test_planted_heads_get_their_roles(facts):
    b, s = facts.heads.shape
    positions = np.broadcast_to(np.arange(s), (b, s))
    previous = np.maximum(positions - 1, 0)
    along_arcs = np.where(facts.heads == ROOT, positions, facts.heads)
    rank_or_low = np.where(facts.valid, facts.ranks, -1)
    rarest = np.broadcast_to(rank_or_low.argmax(axis=1)[:, None], (b, s))
    uniform = torch.as_tensor(facts.valid[:, None, :] / facts.lengths[:, None, None], dtype=torch.float64)
    patterns = torch.cat(
        [one_hot(previous, facts.lengths), one_hot(along_arcs, facts.lengths), one_hot(rarest, facts.lengths),
         uniform.expand(b, s, s)[:, None]],
        dim=1,
    )  # fmt: skip
    roles, syntax = layer_roles(patterns, facts, layer=2)
    prev, arcs, rare, flat = (roles.iloc[h] for h in range(4))
    assert (roles.layer == 2).all() and list(roles["head"]) == [0, 1, 2, 3]
    assert prev.position_offset == -1 and prev.position_share == 1.0 and prev.positional and prev.confidence == 1.0
    assert not arcs.positional and not rare.positional and not flat.positional
    # along the arcs: every relation's dependents find their heads, which no fixed offset does for all of them
    dep = syntax[(syntax["head"] == 1) & (syntax.direction == "dep")]
    assert set(dep.relation) == {"det", "amod", "nsubj", "obj", "prep", "pobj"} and (dep.accuracy == 1.0).all()
    assert arcs.syntactic and arcs.syntactic_accuracy == 1.0 and arcs.syntactic_baseline < 0.9
    # a determiner's noun sits 1 to 3 tokens on: the best offset finds it only where there is no adjective
    det = dep[dep.relation == "det"].iloc[0]
    assert det.baseline == pytest.approx(0.5, abs=0.06)
    assert rare.rare_share == 1.0 and prev.rare_share < 0.5 and rare.rare_chance < 0.3
    assert flat.confidence == pytest.approx(len(facts.lengths) / facts.lengths.sum())  # 1 / length, per token
    assert flat.rare_share == 0.0  # argmax of a tie: the first key, a determiner, never the rarest word


def test_numbers_by_hand():
    """Two sentences, lengths 3 and 2 (padded to 4): w0 <- w1 -> w2 (both relation 0, to the root w1) and w0 <- w1
    (relation 1); ranks 5 9 1 and 2 3. One head with hand-made attention."""
    facts = SentenceFacts(
        lengths=np.array([3, 2]),
        heads=np.array([[1, ROOT, 1, -2], [1, ROOT, -2, -2]]),
        relations=np.array([[0, -1, 0, -1], [1, -1, -1, -1]]),
        ranks=np.array([[5, 9, 1, -2], [2, 3, -2, -2]]),
        relation_names=("r0", "r1"),
    )
    pattern = torch.zeros(2, 1, 4, 4, dtype=torch.float64)
    pattern[0, 0, 0] = torch.tensor([0.2, 0.7, 0.1, 0.0])  # w0 -> w1 (its head; the rarest; offset +1)
    pattern[0, 0, 1] = torch.tensor([0.1, 0.3, 0.6, 0.0])  # w1 -> w2 (a dependent; offset +1)
    pattern[0, 0, 2] = torch.tensor([0.5, 0.4, 0.1, 0.0])  # w2 -> w0 (offset -2; not its head)
    pattern[1, 0, 0] = torch.tensor([0.1, 0.2, 0.0, 0.7])  # padding's weight is ignored: w0 -> w1 (its head)
    pattern[1, 0, 1] = torch.tensor([0.8, 0.2, 0.0, 0.0])  # w1 -> w0 (its dependent; offset -1)
    roles, syntax = layer_roles(pattern, facts, layer=0)
    row = roles.iloc[0]
    assert row.confidence == pytest.approx((0.7 + 0.6 + 0.5 + 0.2 + 0.8) / 5)
    # offset +1 is the mode (3 hits; -2 and -1 one each): queries w0, w1 of sentence 1 and w0 of sentence 2 have a
    # token there, all three hit
    assert row.position_offset == 1 and row.position_share == 1.0 and row.positional
    # rarest: w1 (9) and w1 (3); hits: s1 w0, s2 w0 -> 2 of 5; chance 1/3 for 3 queries, 1/2 for 2
    assert row.rare_share == pytest.approx(2 / 5) and row.rare_chance == pytest.approx((3 / 3 + 2 / 2) / 5)
    table = syntax.set_index(["relation", "direction"])
    # r0 dep: w0 and w2 of sentence 1 look for w1: w0 hits, w2 misses; the best offset (+1 for w0, -1 for w2): 1/2
    assert table.loc[("r0", "dep")].accuracy == 0.5 and table.loc[("r0", "dep")].baseline == 0.5
    # r0 head: w1 of sentence 1 looks for w0 or w2: hits w2; offset -1 or +1 both reach one: 1
    assert table.loc[("r0", "head")].accuracy == 1.0 and table.loc[("r0", "head")].baseline == 1.0
    # r1: sentence 2's w0 -> w1 hits; w1 -> w0 hits; baselines 1 (a single query each)
    assert table.loc[("r1", "dep")].accuracy == 1.0 and table.loc[("r1", "head")].accuracy == 1.0
    assert table.loc[("r1", "dep")].queries == 1 and table.loc[("r0", "dep")].queries == 2
    assert not row.syntactic  # nowhere 0.1 above its baseline


def test_shapes_and_padding(facts):
    assert facts.heads.shape == (300, MAX_SOURCE)
    # weight on padding never makes a padded key the argmax
    b, s = facts.heads.shape
    pattern = torch.zeros(b, 1, s, s, dtype=torch.float64)
    pattern[..., -1] = 0.9  # the last position is padding in most sentences
    pattern[..., 0] = 0.1
    roles, _ = layer_roles(pattern, facts, layer=0)
    short = facts.lengths < s
    assert short.any() and roles.iloc[0].confidence <= 0.9
