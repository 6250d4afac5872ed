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
"""

import numpy as np

from headcount.config.task import TaskConfig
from headcount.data.synthetic import BOS
from headcount.data.translation import VERB, Lexicon, translation_pairs
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
        trained_on = getattr(tokenizer, "data_source", None)
        if not isinstance(tokenizer, IdsOnly) or trained_on != TRAINED_ON:
            on = trained_on if trained_on is not None else tokenizer.kind
            raise ConfigError(
                "task.source", self.name, f"writes the generated language's token ids, for a model trained on "
                f"data.source={TRAINED_ON}; this model reads {on}"
            )  # fmt: skip
        lex = Lexicon.for_vocab(tokenizer.vocab_size)
        rng = np.random.default_rng(cfg.seed)
        n = cfg.n_prompts or DEFAULT_PROMPTS
        pairs = translation_pairs(rng, n, tokenizer.vocab_size)
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
