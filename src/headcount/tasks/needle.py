"""`needle`: a passphrase stated once inside filler text and asked for at the end (needle in a haystack, after Wu et
al. 2024, "Retrieval head mechanistically explains long-context factuality").

    The grass is green. ... The secret passphrase is apple river stone cloud. ... A light rain fell.
    What is the secret passphrase? The secret passphrase is apple river stone -> " cloud"

Every word of the passphrase is scored, teacher-forced: the prompt ends with all but the last word, and the positions
before each word predict it. The words are one token each for the tokenizer (common nouns; single letters for a
byte-level one via `task.names`), so that the i-th scored token has one context token it copies: the named position
`needle<i>`. `task.n_filler` filler sentences, the needle at a seeded random depth among them, `task.needle_words`
words. No wrong answers and no corrupted prompts: the behaviour is measured by accuracy (or log-probability) of the
copy. Seeded and deterministic.
"""

import numpy as np

from headcount.config.task import TaskConfig
from headcount.errors import ConfigError
from headcount.tasks.prompts import TaskPrompt
from headcount.tasks.registry import SOURCES, TaskSource
from headcount.tasks.tokens import TaskTokenizer, one_token_answers, token_at

WORDS = (
    "apple", "river", "stone", "cloud", "table", "garden", "window", "pencil", "candle", "forest", "bottle", "mirror",
    "ladder", "basket", "violin", "tiger", "rocket", "island", "button", "castle", "orange", "silver", "winter",
    "summer", "dragon", "yellow", "purple", "planet", "ocean", "desert",
)  # fmt: skip
FILLER = (
    "The grass is green and the sky is blue.",
    "The sun rises in the east and sets in the west.",
    "Birds sing in the morning while people go to work.",
    "Rivers flow down from the mountains to the sea.",
    "Many people enjoy reading books in the evening.",
    "The market was busy with traders selling fruit.",
    "Children played games in the park after school.",
    "The old bridge crossed a quiet stream.",
    "A light rain fell over the small village.",
    "The library opened its doors at nine o'clock.",
    "Farmers harvested wheat at the end of summer.",
    "The train arrived at the station on time.",
)
NEEDLE = "The secret passphrase is"
QUESTION = "What is the secret passphrase? The secret passphrase is"
DEFAULT_PROMPTS = 64


@SOURCES.register
class Needle(TaskSource):
    """a passphrase in filler text, asked for at the end: copying it back from the context"""

    name = "needle"

    def prompts(self, cfg: TaskConfig, tokenizer: TaskTokenizer) -> list[TaskPrompt]:
        words, sep = one_token_answers(list(cfg.names or WORDS), tokenizer, "task.names", cfg.needle_words)
        if cfg.needle_words < 1 or cfg.n_filler < 0:
            raise ConfigError("task.needle_words", cfg.needle_words, "must be a positive integer (and n_filler >= 0)")
        rng = np.random.default_rng(cfg.seed)
        return [self.prompt(rng, words, sep, cfg, tokenizer) for _ in range(cfg.n_prompts or DEFAULT_PROMPTS)]

    @staticmethod
    def prompt(rng: np.random.Generator, words: list[str], sep: str, cfg: TaskConfig, tokenizer) -> TaskPrompt:
        passphrase = [words[j] for j in rng.choice(len(words), size=cfg.needle_words, replace=False)]
        filler = [FILLER[int(j)] for j in rng.integers(len(FILLER), size=cfg.n_filler)]
        depth = int(rng.integers(cfg.n_filler + 1))
        said = f"{NEEDLE}{''.join(' ' + w for w in passphrase)}."
        before = " ".join(filler[:depth] + [""])
        text = f"{before}{said} {' '.join(filler[depth:] + [''])}{QUESTION}"
        needle_chars, char = [], len(before) + len(NEEDLE)
        for word in passphrase:  # the last character of each word of the stated passphrase
            char += 1 + len(word)
            needle_chars.append(char - 1)
        tail, word_ends = "", []
        for word in passphrase:
            tail += " " + word
            word_ends.append(len(text) + len(tail) - 1)
        prompt = text + tail[: tail.rindex(" ") + (1 if sep == "" else 0)]
        ids, spans = tokenizer.encode(prompt)
        # The token before each word predicts it; the last word is the prompt's next token. Counted from the end,
        # so that special tokens put in front (task.add_special_tokens) move nothing.
        positions = [token_at(spans, end) - 1 - len(ids) for end in word_ends[:-1]] + [-1]
        named = {f"needle{i}": c for i, c in enumerate(needle_chars)}
        return TaskPrompt(prompt, [sep + w for w in passphrase], positions=positions, named=named)
