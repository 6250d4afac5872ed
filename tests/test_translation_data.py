"""The generated translation task (data/translation.py): its arcs form a tree rooted at the verb, its target is the
source reordered (SVO -> SOV, adjectives after the noun, postpositions) with every agreement it promises, the same seed
gives the same data, and its words follow the Zipf law and the frequency ranks it states."""

import numpy as np
import pytest

from headcount.config.data import DataConfig
from headcount.data import build_splits
from headcount.data.translation import (
    ADJ,
    DET,
    EOS,
    NO_TOKEN,
    NOUN,
    PREP,
    ROOT,
    SEQUENCE,
    VERB,
    Lexicon,
    split_pairs,
    translation_pairs,
    zipf,
)
from headcount.errors import ConfigError

VOCAB = 512


@pytest.fixture(scope="module")
def pairs():
    return translation_pairs(np.random.default_rng(3), 2000, VOCAB)


@pytest.fixture(scope="module")
def lex():
    return Lexicon.for_vocab(VOCAB)


def test_the_arcs_form_a_tree_rooted_at_the_verb(pairs):
    for row in range(len(pairs.source)):
        length = pairs.source_lengths[row]
        heads, roles = pairs.heads[row, :length], pairs.roles[row, :length]
        assert (pairs.heads[row, length:] == NO_TOKEN).all()
        assert list(np.flatnonzero(heads == ROOT)) == list(np.flatnonzero(roles == VERB))
        assert len(np.flatnonzero(heads == ROOT)) == 1
        for token in range(length):  # every token reaches the root in fewer steps than there are tokens
            at, steps = token, 0
            while heads[at] != ROOT:
                assert 0 <= heads[at] < length and heads[at] != at
                at, steps = heads[at], steps + 1
                assert steps < length
        # the arcs the docstring names, by the word classes at both ends
        for token in range(length):
            head = heads[token]
            if roles[token] in (DET, ADJ):
                assert roles[head] == NOUN and head > token and pairs.phrases[row, head] == pairs.phrases[row, token]
            elif roles[token] == NOUN:
                assert roles[head] == (PREP if pairs.phrases[row, token] == 2 else VERB)
            elif roles[token] == PREP:
                assert roles[head] == VERB


def reference_translation(source, heads, roles, lex):
    """The target made from the source by its arcs alone: each noun's phrase (its dependents) as det noun adjectives,
    subject, object, then the prepositional phrase with its postposition, then the verb."""
    nouns = [t for t in range(len(source)) if roles[t] == NOUN]
    gender = {t: lex.genders[(source[t] - lex.src_noun) // 2] for t in nouns}
    number = {t: (source[t] - lex.src_noun) % 2 for t in nouns}
    verb = int(np.flatnonzero(roles == VERB)[0])
    subject = next(t for t in nouns if heads[t] == verb and t < verb)
    obj = next(t for t in nouns if heads[t] == verb and t > verb)

    def phrase(noun):
        dependents = [t for t in range(len(source)) if heads[t] == noun]
        det = next(t for t in dependents if roles[t] == DET)
        definite = (source[det] - lex.src_det) // 2
        out = [lex.tgt_det + 4 * definite + 2 * gender[noun] + number[noun], lex.tgt_noun + source[noun] - lex.src_noun]
        adjectives = [t for t in dependents if roles[t] == ADJ]
        return out + [lex.tgt_adj + 2 * (source[t] - lex.src_adj) + gender[noun] for t in adjectives]

    target = phrase(subject) + phrase(obj)
    for prep in (t for t in range(len(source)) if roles[t] == PREP):
        target += phrase(next(t for t in nouns if heads[t] == prep)) + [lex.tgt_post + source[prep] - lex.src_prep]
    verb_lemma = (source[verb] - lex.src_verb) // 2
    return [*target, lex.tgt_verb + 4 * verb_lemma + 2 * number[subject] + gender[obj], EOS]


def test_the_target_is_the_source_reordered_with_its_agreements(pairs, lex):
    """Through the arcs: so a wrong arc, order or agreement in the generator fails here."""
    for row in range(len(pairs.source)):
        s, t = pairs.source_lengths[row], pairs.target_lengths[row]
        expected = reference_translation(pairs.source[row, :s], pairs.heads[row, :s], pairs.roles[row, :s], lex)
        assert list(pairs.target[row, :t]) == expected
        assert (pairs.target[row, t:] == 0).all()


def test_source_agreement(pairs, lex):
    for row in range(len(pairs.source)):
        s = pairs.source_lengths[row]
        source, heads, roles = pairs.source[row, :s], pairs.heads[row, :s], pairs.roles[row, :s]
        verb = int(np.flatnonzero(roles == VERB)[0])
        subject = next(t for t in range(s) if roles[t] == NOUN and heads[t] == verb and t < verb)
        noun_number = (source[subject] - lex.src_noun) % 2
        assert (source[verb] - lex.src_verb) % 2 == noun_number
        for det in np.flatnonzero(roles == DET):
            assert (source[det] - lex.src_det) % 2 == (source[heads[det]] - lex.src_noun) % 2


def test_the_task_exercises_every_choice(pairs):
    """Reordering needs material: both numbers, genders, 0-2 adjectives and the optional PP all occur."""
    lengths = set(pairs.source_lengths.tolist())
    assert min(lengths) == 5 and max(lengths) == 14
    assert (pairs.roles == PREP).any(axis=1).mean() == pytest.approx(0.5, abs=0.05)
    adjectives = (pairs.roles == ADJ).sum(axis=1)
    assert adjectives.mean() == pytest.approx(2.5 * 0.7, abs=0.1) and adjectives.max() == 6


def test_same_seed_same_data_other_seed_other_data():
    a = translation_pairs(np.random.default_rng(7), 50, VOCAB)
    b = translation_pairs(np.random.default_rng(7), 50, VOCAB)
    c = translation_pairs(np.random.default_rng(8), 50, VOCAB)
    for name in ("source", "target", "heads", "ranks", "roles", "phrases"):
        assert np.array_equal(getattr(a, name), getattr(b, name))
    assert not np.array_equal(a.source, c.source)


def test_splits_are_the_pairs_with_their_arcs():
    cfg = DataConfig(source="translation", vocab_size=VOCAB, seq_len=SEQUENCE, n_train=64, n_val=16, n_test=16)
    ids, mask = arrays(cfg, "val")
    assert np.array_equal(ids, arrays(cfg, "val")[0])
    assert not np.array_equal(ids, arrays(cfg, "test")[0])
    val = split_pairs(cfg, "val")
    for row in range(16):
        s, t = val.source_lengths[row], val.target_lengths[row]
        assert ids[row, 0] == 0 and ids[row, 1 + s] == 1
        assert list(ids[row, 1 : 1 + s]) == list(val.source[row, :s])
        assert list(ids[row, 2 + s : 2 + s + t]) == list(val.target[row, :t])
        assert list(np.flatnonzero(mask[row])) == list(range(2 + s, 2 + s + t))
    assert not np.array_equal(arrays(DataConfig(**{**cfg.__dict__, "seed": 1}), "val")[0], ids)


def arrays(cfg, split):
    rows = build_splits(cfg)[split][:]
    return rows["input_ids"].numpy(), rows["loss_mask"].numpy()


def test_words_follow_zipf_and_the_stated_ranks(lex):
    sample = translation_pairs(np.random.default_rng(11), 20000, VOCAB)
    tokens = sample.source[sample.heads != NO_TOKEN]
    counts = np.bincount(tokens, minlength=lex.size)
    expected = lex.source_token_probabilities()
    assert 0.5 * np.abs(counts / counts.sum() - expected).sum() < 0.01  # total variation distance
    # nouns: counts by lemma against rank on log-log axes have the Zipf exponent as slope
    lemma_counts = counts[lex.src_noun : lex.src_adj].reshape(-1, 2).sum(axis=1)
    slope = np.polyfit(np.log(np.arange(1, 21)), np.log(lemma_counts[:20]), 1)[0]
    assert slope == pytest.approx(-1.0, abs=0.1)
    assert np.allclose(zipf(4), np.array([12, 6, 4, 3]) / 25)
    # ranks: 1 is the most frequent word; counts fall as ranks grow
    used = np.flatnonzero(expected > 0)
    ranks = lex.source_ranks[used]
    assert sorted(ranks.tolist()) == list(range(1, len(used) + 1))
    by_rank = used[np.argsort(ranks)]
    assert counts[by_rank[0]] == counts.max()
    assert np.corrcoef(np.argsort(np.argsort(-counts[by_rank])), np.arange(len(used)))[0, 1] > 0.97
    assert (sample.ranks[sample.heads != NO_TOKEN] == lex.source_ranks[tokens]).all()
    assert counts[by_rank[-20:]].mean() < counts[by_rank[:20]].mean() / 30  # rare words exist


@pytest.mark.parametrize(
    "overrides, key",
    [({"vocab_size": 40}, "data.vocab_size"), ({"seq_len": SEQUENCE - 1}, "data.seq_len")],
)
def test_bad_sizes_are_one_line(overrides, key):
    cfg = DataConfig(**{"source": "translation", "vocab_size": VOCAB, "seq_len": SEQUENCE, **overrides})
    with pytest.raises(ConfigError) as error:
        build_splits(cfg)
    assert error.value.key == key and "\n" not in str(error.value)
