"""`masked_agreement`: subject-verb number agreement read at an encoder's [MASK] (Linzen et al. 2016's task, as
Goldberg 2019 put it to BERT's masked-LM head): "the girl of the dogs [MASK] here ." -> "is" rather than "are".

The subject's number decides the verb; the attractor between them, of the other number, does not. The corrupted
prompt swaps the subject for a noun of the other number, so the correct verb flips: logit(answer) - logit(wrong) at
the mask is the masked-LM point's logit difference and patching measures what carries the subject's number to the
mask. Prompts are token ids in the encoder's tokenizer, its own special tokens added ([CLS] ... [SEP]), scored at the
[MASK] position (a masked-LM point: the logits there, not the next token's).

An encoder attends to every position, padding too, so every prompt and its counterpart have one length: the nouns
used are those whose token count is the most common one among both numbers under the tokenizer (one WordPiece each
in BERT's vocabulary; four characters in headcount:tiny-random-bert's). Seeded and deterministic.
"""

import numpy as np

from headcount.config.task import TaskConfig
from headcount.errors import ConfigError
from headcount.tasks.prompts import TaskPrompt
from headcount.tasks.registry import SOURCES, TaskSource
from headcount.tasks.tokens import TaskTokenizer

SINGULAR = ("girl", "book", "tree", "bird", "dog", "cat", "boy", "key", "car", "man", "house", "child", "song", "road")
PLURAL = ("dogs", "cats", "boys", "keys", "cars", "men", "girls", "books", "trees", "birds", "houses", "songs", "roads")
VERBS = ("is", "are")  # the singular's and the plural's
TEMPLATE = "the {subject} of the {attractor} {mask} here ."
DEFAULT_PROMPTS = 32


@SOURCES.register
class MaskedAgreement(TaskSource):
    """subject-verb agreement at an encoder's [MASK] (is/are), the subject's number flipped in the counterpart"""

    name = "masked_agreement"
    masked_lm = True  # an encoder's task (ablation/encoder_checks.py)

    def prompts(self, cfg: TaskConfig, tokenizer: TaskTokenizer) -> list[TaskPrompt]:
        mask = getattr(getattr(tokenizer, "tokenizer", None), "mask_token", None)
        if mask is None:
            raise ConfigError(
                "task.source",
                self.name,
                f"needs a tokenizer with a mask token (BERT's [MASK]); {tokenizer.kind} has none",
            )
        singular, plural = same_length_nouns(tokenizer)
        rng = np.random.default_rng(cfg.seed)
        return [self.prompt(i, rng, singular, plural, mask, tokenizer) for i in range(cfg.n_prompts or DEFAULT_PROMPTS)]

    @staticmethod
    def prompt(
        i: int, rng: np.random.Generator, singular: list[str], plural: list[str], mask: str, tokenizer: TaskTokenizer
    ) -> TaskPrompt:
        numbers = (singular, plural) if i % 2 == 0 else (plural, singular)  # singular and plural subjects alternate
        subject, counterpart = (
            numbers[0][int(rng.integers(len(numbers[0])))],
            numbers[1][int(rng.integers(len(numbers[1])))],
        )
        attractor = numbers[1][int(rng.integers(len(numbers[1])))]
        ids, _ = tokenizer.encode(TEMPLATE.format(subject=subject, attractor=attractor, mask=mask), True)
        corrupted, _ = tokenizer.encode(TEMPLATE.format(subject=counterpart, attractor=attractor, mask=mask), True)
        at = ids.index(tokenizer.tokenizer.mask_token_id)
        answer, wrong = VERBS if i % 2 == 0 else VERBS[::-1]
        return TaskPrompt(ids, [answer], [wrong], corrupted, positions=[at], named={"mask": at})


def same_length_nouns(tokenizer: TaskTokenizer) -> tuple[list[str], list[str]]:
    """The singular and plural nouns of the token count most common among both numbers (at least one of each)."""
    count = lambda word: len(tokenizer.encode(word)[0])  # noqa: E731
    lengths = {count(word) for word in (*SINGULAR, *PLURAL)}
    best = max(sorted(lengths), key=lambda n: min(sum(count(w) == n for w in words) for words in (SINGULAR, PLURAL)))
    singular = [w for w in SINGULAR if count(w) == best]
    plural = [w for w in PLURAL if count(w) == best]
    if not singular or not plural:
        raise ConfigError(
            "task.source", "masked_agreement", "the tokenizer gives no singular and plural noun one length"
        )
    return singular, plural
