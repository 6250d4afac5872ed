"""`kv_retrieval`: "key: value" lines, then one of the keys; the answer is its value.

    apple: 7
    river: 3
    stone: 9
    stone: -> " 9"

The corrupted prompt changes that key's value in its line to a digit the prompt does not hold, which is then the
wrong answer: the logit difference measures how much the model reads the value from the line its key names. Keys
are common words (any number of tokens), values single digits, one token each (with the leading space, or bare after
a space that ends the prompt, as in `ioi`). Named positions: key (the queried key in its line), value (its value),
query (the final key) and end. Seeded and deterministic.
"""

import numpy as np

from headcount.config.task import TaskConfig
from headcount.errors import ConfigError
from headcount.tasks.prompts import TaskPrompt
from headcount.tasks.registry import SOURCES, TaskSource
from headcount.tasks.tokens import TaskTokenizer, one_token_answers

KEYS = (
    "apple", "river", "stone", "cloud", "table", "garden", "window", "pencil", "candle", "forest", "bottle", "mirror",
    "ladder", "basket", "violin", "tiger", "rocket", "island", "button", "castle",
)  # fmt: skip
DIGITS = tuple("0123456789")
DEFAULT_PROMPTS = 64


@SOURCES.register
class KVRetrieval(TaskSource):
    """key-value lines, then a key: retrieve its value from the context"""

    name = "kv_retrieval"

    def prompts(self, cfg: TaskConfig, tokenizer: TaskTokenizer) -> list[TaskPrompt]:
        if not 2 <= cfg.n_pairs <= min(len(KEYS), len(DIGITS) - 1):
            raise ConfigError("task.n_pairs", cfg.n_pairs, f"must be in 2..{len(DIGITS) - 1} (values are digits)")
        digits, sep = one_token_answers(list(DIGITS), tokenizer, "task.source", len(DIGITS))
        rng = np.random.default_rng(cfg.seed)
        return [self.prompt(rng, cfg.n_pairs, digits, sep) for _ in range(cfg.n_prompts or DEFAULT_PROMPTS)]

    @staticmethod
    def prompt(rng: np.random.Generator, n_pairs: int, digits: list[str], sep: str) -> TaskPrompt:
        keys = [KEYS[j] for j in rng.choice(len(KEYS), size=n_pairs, replace=False)]
        values = [digits[j] for j in rng.choice(len(digits), size=n_pairs + 1, replace=False)]
        values, other = values[:n_pairs], values[n_pairs]  # `other` appears nowhere in the clean prompt
        asked = int(rng.integers(n_pairs))
        clean = corrupted = ""
        named = {}
        for i, (key, value) in enumerate(zip(keys, values)):
            line_start = len(clean)
            clean += f"{key}: {value}\n"
            corrupted += f"{key}: {other if i == asked else value}\n"
            if i == asked:
                named = {"key": line_start + len(key) - 1, "value": line_start + len(key) + 2}
        query = f"{keys[asked]}:" + (" " if sep == "" else "")
        named["query"] = len(clean) + len(keys[asked]) - 1
        return TaskPrompt(clean + query, [sep + values[asked]], [sep + other], corrupted + query, named=named)
