"""`translation_verb`: an encoder-decoder's translation of the generated language pair (data/translation.py), scored
at the target's verb. The source is SVO and the target SOV, so the verb the target ends with is read from the middle
of the source, and nothing in the target before it says which verb it is: only cross-attention can carry it.

Each prompt is one sentence pair of the generator: the source sentence (the encoder's input) and the decoder's stream
teacher-forced up to the verb (the start token, then the target's noun phrases and postposition), scored at its last
position: the answer is the target's verb (its lemma, its subject's number and its object's gender), the wrong answer
the verb a source with another verb lemma would demand (the same number and gender). The counterpart's source is the
sentence with that other verb lemma (one token differs, the source's verb); its decoder stream is the same, so the two
runs differ only through the encoder. Token ids (no tokenizer), for a model trained on data.source=
translation_seq2seq with the same vocabulary; deterministic from task.seed.

`translation_agreement`: the same sentences and scored position, the verb's agreement with its object's gender (a
fixed property of the noun's lemma): the counterpart's source has an object noun of the other gender (one token
differs, the same number), so its translation differs before the verb too (the object's determiner, noun and
adjectives), and its decoder stream is that translation's; the wrong answer is the verb of the other gender.
"""

import numpy as np

from headcount.config.task import TaskConfig
from headcount.data.synthetic import BOS
from headcount.data.translation import NOUN, OBJ, VERB, Lexicon, TranslationPairs, translation_pairs
from headcount.errors import ConfigError
from headcount.tasks.prompts import TaskPrompt
from headcount.tasks.registry import SOURCES, TaskSource
from headcount.tasks.tokens import IdsOnly, TaskTokenizer

DEFAULT_PROMPTS = 64
TRAINED_ON = "translation_seq2seq"


@SOURCES.register
class TranslationVerb(TaskSource):
    """an encoder-decoder's target verb, teacher-forced; the counterpart's source has another verb lemma"""

    name = "translation_verb"
    seq2seq = True  # an encoder-decoder's task (ablation/seq2seq_checks.py)
    writes_ids = True

    def prompts(self, cfg: TaskConfig, tokenizer: TaskTokenizer) -> list[TaskPrompt]:
        lex, rng, pairs = sentences(self.name, cfg, tokenizer)
        n = len(pairs.source)
        offsets = rng.integers(1, lex.n_verbs, size=n)  # another lemma: (v + offset) mod n_verbs, never v itself
        prompts = []
        for row in range(n):
            length = int(pairs.source_lengths[row])
            source = pairs.source[row, :length]
            verb_at = int(np.flatnonzero(pairs.roles[row, :length] == VERB)[0])
            lemma, number = divmod(int(source[verb_at]) - lex.src_verb, 2)
            other = (lemma + int(offsets[row])) % lex.n_verbs
            corrupted = source.copy()
            corrupted[verb_at] = lex.src_verb + 2 * other + number
            target = pairs.target[row, : int(pairs.target_lengths[row])]
            answer = int(target[-2])  # the verb, before EOS
            gender = (answer - lex.tgt_verb) % 2
            wrong = lex.tgt_verb + 4 * other + 2 * number + gender
            stream = [BOS, *target[:-2].tolist()]
            sources = {"source": source.tolist(), "corrupted_source": corrupted.tolist()}
            prompts.append(TaskPrompt(stream, [answer], [wrong], stream, **sources))
        return prompts


def sentences(
    name: str, cfg: TaskConfig, tokenizer: TaskTokenizer
) -> tuple[Lexicon, np.random.Generator, TranslationPairs]:
    """The language's lexicon, the task's generator and its sentence pairs; ConfigError for a model that does not read
    the generated language."""
    trained_on = getattr(tokenizer, "data_source", None)
    if not isinstance(tokenizer, IdsOnly) or trained_on != TRAINED_ON:
        on = trained_on if trained_on is not None else tokenizer.kind
        raise ConfigError(
            "task.source", name, f"writes the generated language's token ids, for a model trained on "
            f"data.source={TRAINED_ON}; this model reads {on}"
        )  # fmt: skip
    rng = np.random.default_rng(cfg.seed)
    pairs = translation_pairs(rng, cfg.n_prompts or DEFAULT_PROMPTS, tokenizer.vocab_size)
    return Lexicon.for_vocab(tokenizer.vocab_size), rng, pairs


@SOURCES.register
class TranslationAgreement(TaskSource):
    """an encoder-decoder's target verb agreeing with its object's gender; the counterpart's object noun of the other"""

    name = "translation_agreement"
    seq2seq = True
    writes_ids = True

    def prompts(self, cfg: TaskConfig, tokenizer: TaskTokenizer) -> list[TaskPrompt]:
        lex, rng, pairs = sentences(self.name, cfg, tokenizer)
        draws = rng.random(len(pairs.source))
        prompts = []
        for row, draw in enumerate(draws):
            length = int(pairs.source_lengths[row])
            source = pairs.source[row, :length]
            noun_at = int(np.flatnonzero((pairs.roles[row, :length] == NOUN) & (pairs.phrases[row, :length] == OBJ))[0])
            lemma, number = divmod(int(source[noun_at]) - lex.src_noun, 2)
            others = np.flatnonzero(lex.genders != lex.genders[lemma])  # the lemmas of the other gender
            other = int(others[int(draw * len(others))])
            corrupted = source.copy()
            corrupted[noun_at] = lex.src_noun + 2 * other + number
            target = pairs.target[row, : int(pairs.target_lengths[row])]
            answer = int(target[-2])  # the verb, before EOS
            stream = [BOS, *target[:-2].tolist()]
            wrong = flipped(answer, lex.tgt_verb, 1)  # the verb of the other gender
            sources = {"source": source.tolist(), "corrupted_source": corrupted.tolist()}
            prompts.append(TaskPrompt(stream, [answer], [wrong], other_object(stream, lex, other), **sources))
        return prompts


def other_object(stream: list[int], lex: Lexicon, lemma: int) -> list[int]:
    """The decoder stream with the object's noun phrase translated for the noun `lemma` (of the other gender): its
    determiner's and adjectives' gender bit flipped and its noun replaced, the number kept. The object's phrase is the
    target's second: determiner, noun, then adjectives."""
    out = list(stream)
    is_det = [lex.tgt_det <= t < lex.tgt_noun for t in out]
    at = [i for i, det in enumerate(is_det) if det][1]  # the object's determiner
    out[at] = flipped(out[at], lex.tgt_det, 2)  # det (d, gender g, number m) = det0' + 4d + 2g + m
    out[at + 1] = lex.tgt_noun + 2 * lemma + (out[at + 1] - lex.tgt_noun) % 2
    i = at + 2
    while i < len(out) and lex.tgt_adj <= out[i] < lex.tgt_verb:
        out[i] = flipped(out[i], lex.tgt_adj, 1)  # adjective (i, gender g) = adj0' + 2i + g
        i += 1
    return out


def flipped(token: int, first: int, bit: int) -> int:
    """A target word's id with one bit of its offset in its class flipped (gender: 2 for determiners, 1 for
    adjectives and verbs; Lexicon's layout)."""
    return first + ((token - first) ^ bit)
