"""A generated translation task: a synthetic language pair with reordering, agreement and a Zipfian vocabulary, whose
generator knows every source sentence's dependency arcs and every word's frequency rank (what Voita et al. 2019's
syntactic and rare-word heads are measured against; Michel et al. 2019 and Voita et al. 2019 ablated the heads of
translation models).

Source (SVO, adjectives before the noun, prepositions):  S = NP_subj V NP_obj [P NP_pp],  NP = Det Adj{0,2} N
Target (SOV, adjectives after the noun, postpositions): S' = NP'_subj NP'_obj [NP'_pp P'] V',  NP' = Det' N' Adj'{0,2}

Agreement. Source: Det and N carry their noun phrase's number, V its subject's number. Target: Det' carries its noun's
gender (a fixed property of the noun) and number, each Adj' its noun's gender, V' its subject's number and its
object's gender. So a target word can depend on a source word far from it (V' on the object noun's gender).

Arcs (the head of each source token; the verb is the root, head -1): Det -> N, Adj -> N, N_subj -> V, N_obj -> V,
P -> V, N_pp -> P.

Vocabulary. Lemmas of each open class (nouns, adjectives, verbs, prepositions) are drawn from a Zipf law,
p(lemma of rank r) proportional to 1 / r; determiners are definite or indefinite (0.6 / 0.4), a noun phrase is plural
with probability 0.3, has 0, 1 or 2 adjectives (0.5 / 0.3 / 0.2), and a sentence has a prepositional phrase with
probability 0.5. Every source token's expected frequency follows from these probabilities in closed form
(`source_token_probabilities`), and its rank (1 = the most frequent) from that.

Token ids: 0 = BOS (and padding), 1 = SEP, 2 = EOS, then the source words, then the target words; the lexicon is the
largest that fits data.vocab_size (nouns : adjectives : verbs = 2 : 1 : 1, 4 prepositions); ids beyond it are unused.
The language depends on data.vocab_size alone: data.seed draws the sentences, never the grammar or the lexicon.

As headcount examples (one sequence, for any model that reads input_ids): BOS source SEP target EOS [padding], the
target and EOS marked as the targets of the loss."""

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from headcount.config.data import DataConfig
from headcount.data.chunking import SPLITS, split_cap
from headcount.data.sources import DATA_SOURCES, SyntheticSource
from headcount.data.synthetic import BOS, SEP, Arrays, _require, split_rng

EOS = 2
N_SPECIAL = 3
N_PREPOSITIONS = 4
MAX_ADJECTIVES = 2
P_ADJECTIVES = (0.5, 0.3, 0.2)  # 0, 1 or 2 adjectives in a noun phrase
P_PLURAL = 0.3
P_DEFINITE = 0.6
P_PP = 0.5
ZIPF_EXPONENT = 1.0
MAX_NP = 1 + MAX_ADJECTIVES + 1
MAX_SOURCE = 3 * MAX_NP + 2  # NP V NP P NP
MAX_TARGET = MAX_SOURCE + 1  # the same words, then EOS
SEQUENCE = 1 + MAX_SOURCE + 1 + MAX_TARGET  # BOS source SEP target EOS
ROOT = -1  # the root's head
NO_TOKEN = -2  # padding's head and rank

# Roles of source tokens, for tests and analyses (source_roles)
DET, ADJ, NOUN, VERB, PREP = range(5)
ROLE_NAMES = ("det", "adj", "noun", "verb", "prep")
SUBJ, OBJ, PP = range(3)  # the three noun phrases


def zipf(n: int) -> np.ndarray:
    weights = 1.0 / np.arange(1, n + 1) ** ZIPF_EXPONENT
    return weights / weights.sum()


@dataclass(frozen=True)
class Lexicon:
    """Every word's token id, fixed by the vocabulary size. Source: det (lemma d, number m) = det0 + 2d + m; noun
    (i, m) = noun0 + 2i + m; adjective i = adj0 + i; verb (i, number of the subject m) = verb0 + 2i + m; preposition
    i = prep0 + i. Target: det (d, gender g, number m) = det0' + 4d + 2g + m; noun (i, m) = noun0' + 2i + m;
    adjective (i, g) = adj0' + 2i + g; verb (i, subject number m, object gender g) = verb0' + 4i + 2m + g; postposition
    i = post0' + i. Lemma i has Zipf rank i + 1."""

    n_nouns: int
    n_adjectives: int
    n_verbs: int

    @classmethod
    def for_vocab(cls, vocab_size: int) -> "Lexicon":
        unit = (vocab_size - N_SPECIAL - 12 - 2 * N_PREPOSITIONS) // 17  # 4 x 2k nouns + 3k adjectives + 6k verbs
        return cls(2 * unit, unit, unit)

    @property
    def src_det(self) -> int:
        return N_SPECIAL

    @property
    def src_noun(self) -> int:
        return self.src_det + 4

    @property
    def src_adj(self) -> int:
        return self.src_noun + 2 * self.n_nouns

    @property
    def src_verb(self) -> int:
        return self.src_adj + self.n_adjectives

    @property
    def src_prep(self) -> int:
        return self.src_verb + 2 * self.n_verbs

    @property
    def tgt_det(self) -> int:
        return self.src_prep + N_PREPOSITIONS

    @property
    def tgt_noun(self) -> int:
        return self.tgt_det + 8

    @property
    def tgt_adj(self) -> int:
        return self.tgt_noun + 2 * self.n_nouns

    @property
    def tgt_verb(self) -> int:
        return self.tgt_adj + 2 * self.n_adjectives

    @property
    def tgt_post(self) -> int:
        return self.tgt_verb + 4 * self.n_verbs

    @property
    def size(self) -> int:
        """The ids the language uses: [0, size)."""
        return self.tgt_post + N_PREPOSITIONS

    @cached_property
    def genders(self) -> np.ndarray:
        """Each noun lemma's gender (0 or 1), the same for every seed: half of each stretch of ranks each."""
        return np.random.default_rng(0).permutation(np.arange(self.n_nouns) % 2)

    def source_token_probabilities(self) -> np.ndarray:
        """(size,) each id's expected count per source sentence divided by the expected sentence length: the
        probability that a source token drawn at random is this id (0 for ids the source never uses)."""
        counts = np.zeros(self.size)
        n_np = 2 + P_PP
        number = np.array([1 - P_PLURAL, P_PLURAL])
        det = np.array([P_DEFINITE, 1 - P_DEFINITE])
        counts[self.src_det : self.src_det + 4] = n_np * np.outer(det, number).ravel()
        counts[self.src_noun : self.src_adj] = n_np * np.outer(zipf(self.n_nouns), number).ravel()
        adjectives_per_np = sum(k * p for k, p in enumerate(P_ADJECTIVES))
        counts[self.src_adj : self.src_verb] = n_np * adjectives_per_np * zipf(self.n_adjectives)
        counts[self.src_verb : self.src_prep] = np.outer(zipf(self.n_verbs), number).ravel()
        counts[self.src_prep : self.tgt_det] = P_PP * zipf(N_PREPOSITIONS)
        return counts / counts.sum()

    @cached_property
    def source_ranks(self) -> np.ndarray:
        """(size,) int64: each source id's frequency rank, 1 = the most frequent (ties by id); 0 for ids the source
        never uses."""
        p = self.source_token_probabilities()
        order = np.lexsort((np.arange(self.size), -p))
        ranks = np.zeros(self.size, dtype=np.int64)
        ranks[order] = np.arange(1, self.size + 1)
        ranks[p == 0] = 0
        return ranks


@dataclass
class TranslationPairs:
    """n sentence pairs. source (n, MAX_SOURCE) and target (n, MAX_TARGET) int64 token ids, right-padded with BOS (0),
    the target ending in EOS; heads (n, MAX_SOURCE): each source token's head index in the source (ROOT for the verb,
    NO_TOKEN for padding); ranks (n, MAX_SOURCE): each source token's frequency rank (NO_TOKEN for padding); roles and
    phrases (n, MAX_SOURCE): each source token's word class (DET..PREP) and noun phrase (SUBJ, OBJ, PP; -1 for the
    verb and the preposition, NO_TOKEN for padding)."""

    source: np.ndarray
    target: np.ndarray
    heads: np.ndarray
    ranks: np.ndarray
    roles: np.ndarray
    phrases: np.ndarray

    @property
    def source_lengths(self) -> np.ndarray:
        return (self.heads != NO_TOKEN).sum(axis=1)

    @property
    def target_lengths(self) -> np.ndarray:
        """Including EOS."""
        return self.source_lengths + 1


def translation_pairs(rng: np.random.Generator, n: int, vocab_size: int) -> TranslationPairs:
    """n random sentences of the source language, their translations, arcs and ranks."""
    lex = Lexicon.for_vocab(vocab_size)
    pairs = TranslationPairs(
        source=np.full((n, MAX_SOURCE), BOS, dtype=np.int64),
        target=np.full((n, MAX_TARGET), BOS, dtype=np.int64),
        heads=np.full((n, MAX_SOURCE), NO_TOKEN, dtype=np.int64),
        ranks=np.full((n, MAX_SOURCE), NO_TOKEN, dtype=np.int64),
        roles=np.full((n, MAX_SOURCE), NO_TOKEN, dtype=np.int64),
        phrases=np.full((n, MAX_SOURCE), NO_TOKEN, dtype=np.int64),
    )
    # Every draw vectorised up front, in a fixed order, so that the data is a function of (rng state, n, vocab)
    nouns = rng.choice(lex.n_nouns, size=(n, 3), p=zipf(lex.n_nouns))
    numbers = (rng.random((n, 3)) < P_PLURAL).astype(np.int64)
    dets = (rng.random((n, 3)) >= P_DEFINITE).astype(np.int64)
    n_adj = rng.choice(len(P_ADJECTIVES), size=(n, 3), p=P_ADJECTIVES)
    adjectives = rng.choice(lex.n_adjectives, size=(n, 3, MAX_ADJECTIVES), p=zipf(lex.n_adjectives))
    verbs = rng.choice(lex.n_verbs, size=n, p=zipf(lex.n_verbs))
    has_pp = rng.random(n) < P_PP
    preps = rng.choice(N_PREPOSITIONS, size=n, p=zipf(N_PREPOSITIONS))
    genders = lex.genders[nouns]
    for row in range(n):
        _write_pair(pairs, row, lex, nouns[row], numbers[row], dets[row], n_adj[row], adjectives[row], genders[row],
                    verbs[row], has_pp[row], preps[row])  # fmt: skip
    present = pairs.heads != NO_TOKEN
    pairs.ranks[present] = lex.source_ranks[pairs.source[present]]
    return pairs


def _write_pair(pairs, row, lex, nouns, numbers, dets, n_adj, adjectives, genders, verb, has_pp, prep) -> None:
    source, heads, roles, phrases, target = [], [], [], [], []

    def source_np(phrase: int, head_of_noun: int) -> None:
        start = len(source)
        noun_at = start + 1 + n_adj[phrase]
        source.append(lex.src_det + 2 * dets[phrase] + numbers[phrase])
        source.extend(lex.src_adj + adjectives[phrase, : n_adj[phrase]])
        source.append(lex.src_noun + 2 * nouns[phrase] + numbers[phrase])
        heads.extend([noun_at] * (1 + n_adj[phrase]) + [head_of_noun])
        roles.extend([DET] + [ADJ] * n_adj[phrase] + [NOUN])
        phrases.extend([phrase] * (2 + n_adj[phrase]))

    def target_np(phrase: int) -> None:
        gender = genders[phrase]
        target.append(lex.tgt_det + 4 * dets[phrase] + 2 * gender + numbers[phrase])
        target.append(lex.tgt_noun + 2 * nouns[phrase] + numbers[phrase])
        target.extend(lex.tgt_adj + 2 * adjectives[phrase, : n_adj[phrase]] + gender)

    verb_at = 2 + n_adj[SUBJ]
    source_np(SUBJ, verb_at)
    source.append(lex.src_verb + 2 * verb + numbers[SUBJ])
    heads.append(ROOT)
    roles.append(VERB)
    phrases.append(-1)
    source_np(OBJ, verb_at)
    target_np(SUBJ)
    target_np(OBJ)
    if has_pp:
        prep_at = len(source)
        source.append(lex.src_prep + prep)
        heads.append(verb_at)
        roles.append(PREP)
        phrases.append(-1)
        source_np(PP, prep_at)
        target_np(PP)
        target.append(lex.tgt_post + prep)
    target.append(lex.tgt_verb + 4 * verb + 2 * numbers[SUBJ] + genders[OBJ])
    target.append(EOS)
    length = len(source)
    pairs.source[row, :length], pairs.heads[row, :length] = source, heads
    pairs.roles[row, :length], pairs.phrases[row, :length] = roles, phrases
    pairs.target[row, : len(target)] = target


def as_sequences(pairs: TranslationPairs, seq_len: int) -> Arrays:
    """BOS source SEP target EOS, right-padded to seq_len; the loss marks the target and EOS."""
    n = len(pairs.source)
    ids, mask = np.full((n, seq_len), BOS, dtype=np.int64), np.zeros((n, seq_len), dtype=bool)
    for row, (s, t) in enumerate(zip(pairs.source_lengths, pairs.target_lengths)):
        ids[row, 1 : 1 + s] = pairs.source[row, :s]
        ids[row, 1 + s] = SEP
        ids[row, 2 + s : 2 + s + t] = pairs.target[row, :t]
        mask[row, 2 + s : 2 + s + t] = True
    return ids, mask


def as_seq2seq(pairs: TranslationPairs, seq_len: int) -> dict[str, np.ndarray]:
    """An encoder-decoder's columns: src_ids (the source, right-padded to seq_len) and src_mask (True on its
    tokens); input_ids, the decoder's stream BOS target EOS (BOS starts the decoding), and loss_mask on target and
    EOS (model/seq2seq.py's layout)."""
    n = len(pairs.source)
    src_ids = np.full((n, seq_len), BOS, dtype=np.int64)
    src_ids[:, :MAX_SOURCE] = pairs.source
    src_mask = np.arange(seq_len)[None] < pairs.source_lengths[:, None]
    input_ids = np.full((n, seq_len), BOS, dtype=np.int64)
    input_ids[:, 1 : 1 + MAX_TARGET] = pairs.target
    loss_mask = np.zeros((n, seq_len), dtype=bool)
    loss_mask[:, 1 : 1 + MAX_TARGET] = np.arange(MAX_TARGET)[None] < pairs.target_lengths[:, None]
    return {"input_ids": input_ids, "loss_mask": loss_mask, "src_ids": src_ids, "src_mask": src_mask}


def _check(cfg: DataConfig) -> None:
    needed = N_SPECIAL + 12 + 2 * N_PREPOSITIONS + 17 * 2
    _require(
        cfg.vocab_size >= needed,
        "data.vocab_size",
        cfg.vocab_size,
        f"translation needs at least {needed} (two lemmas of each class; 512 gives 56 nouns)",
    )
    if cfg.source == "translation_seq2seq":
        _require(
            cfg.seq_len >= MAX_TARGET + 1,
            "data.seq_len",
            cfg.seq_len,
            f"translation_seq2seq needs at least {MAX_TARGET + 1} (BOS, {MAX_TARGET - 1} target words, EOS)",
        )
        return
    _require(
        cfg.seq_len >= SEQUENCE,
        "data.seq_len",
        cfg.seq_len,
        f"translation needs at least {SEQUENCE} (BOS, {MAX_SOURCE} source words, SEP, {MAX_TARGET - 1} target words, "
        "EOS)",
    )


def _make(rng: np.random.Generator, n: int, cfg: DataConfig) -> Arrays:
    return as_sequences(translation_pairs(rng, n, cfg.vocab_size), cfg.seq_len)


def _make_seq2seq(rng: np.random.Generator, n: int, cfg: DataConfig) -> dict[str, np.ndarray]:
    return as_seq2seq(translation_pairs(rng, n, cfg.vocab_size), cfg.seq_len)


DATA_SOURCES.register(
    SyntheticSource(
        "translation",
        _check,
        _make,
        "a generated language pair (SVO to SOV, agreement, Zipfian words): source SEP target",
    )
)
DATA_SOURCES.register(
    SyntheticSource(
        "translation_seq2seq",
        _check,
        _make_seq2seq,
        "the translation task for an encoder-decoder: src_ids to BOS target",
    )
)


def split_pairs(cfg: DataConfig, split: str, n: int | None = None) -> TranslationPairs:
    """The first n sentence pairs (all when None) of a split of data.source=translation, with their arcs and ranks:
    the same sentences, in the same order, as that split's examples (build_splits)."""
    allowed = "arcs and ranks exist for translation and translation_seq2seq only"
    _require(cfg.source in ("translation", "translation_seq2seq"), "data.source", cfg.source, allowed)
    index = SPLITS.index(split)
    total = split_cap(cfg, split)
    pairs = translation_pairs(split_rng(cfg, index), total, cfg.vocab_size)
    keep = slice(0, total if n is None else min(n, total))
    return TranslationPairs(*(getattr(pairs, name)[keep] for name in TranslationPairs.__dataclass_fields__))


# Dependency relations by the word classes at their ends (and, for a noun under the verb, its phrase)
RELATIONS = ("det", "amod", "nsubj", "obj", "prep", "pobj")


def relations(pairs: TranslationPairs) -> np.ndarray:
    """(n, MAX_SOURCE) each source token's relation to its head, an index into RELATIONS; -1 for the root and
    padding."""
    out = np.full(pairs.roles.shape, -1, dtype=np.int64)
    out[pairs.roles == DET] = RELATIONS.index("det")
    out[pairs.roles == ADJ] = RELATIONS.index("amod")
    out[(pairs.roles == NOUN) & (pairs.phrases == SUBJ)] = RELATIONS.index("nsubj")
    out[(pairs.roles == NOUN) & (pairs.phrases == OBJ)] = RELATIONS.index("obj")
    out[pairs.roles == PREP] = RELATIONS.index("prep")
    out[(pairs.roles == NOUN) & (pairs.phrases == PP)] = RELATIONS.index("pobj")
    return out


def target_alignment(pairs: TranslationPairs) -> np.ndarray:
    """(n, MAX_TARGET) each target token's source word: the index in the source of the word it translates (each target
    noun phrase Det' N' Adj'... its source phrase's Det N Adj..., the postposition the preposition, the verb the
    verb); -1 for EOS and padding. The generator writes each translation from the source's phrases
    (`_write_pair`), so this is read off the source's roles and phrases."""
    out = np.full(pairs.target.shape, -1, dtype=np.int64)
    for row in range(len(pairs.source)):
        roles, phrases = pairs.roles[row], pairs.phrases[row]
        order = []
        for phrase in (SUBJ, OBJ, PP):
            at = np.flatnonzero(phrases == phrase)
            if len(at):  # Det N Adj...: the determiner, the noun, then the adjectives in their order
                noun = at[roles[at] == NOUN]
                order += [int(at[0]), *noun.tolist(), *at[roles[at] == ADJ].tolist()]
        order += np.flatnonzero(roles == PREP).tolist() + np.flatnonzero(roles == VERB).tolist()
        out[row, : len(order)] = order
    return out
