"""How a task's text becomes the model's tokens: the checkpoint's tokenizer, bytes, or none (a model trained on a
synthetic alphabet reads token ids only). Each maps text to ids and, for every token, the span of characters it
covers, so a generator can name positions by character ("the subject's second mention") and find their tokens.
"""

from collections.abc import Sequence
from typing import Any, Protocol

from headcount.data.tokens import puts_bos_first
from headcount.errors import ConfigError


class TaskTokenizer(Protocol):
    vocab_size: int
    kind: str  # what reads the text, for messages: "the checkpoint's tokenizer", "bytes", ...
    bos_first: bool  # its own encoding starts with a beginning-of-sequence token (task.add_special_tokens=null adds it)

    def encode(self, text: str, special_tokens: bool = False) -> tuple[list[int], list[tuple[int, int]]]:
        """The ids of `text` and each token's (start, end) character span; special_tokens adds the tokenizer's own."""
        ...

    def decode(self, ids: Sequence[int]) -> str: ...


class HFTokens:
    """A transformers tokenizer (a checkpoint's)."""

    kind = "the checkpoint's tokenizer"

    def __init__(self, tokenizer: Any):
        self.tokenizer, self.vocab_size = tokenizer, len(tokenizer)
        self.bos_first = puts_bos_first(tokenizer)

    def encode(self, text: str, special_tokens: bool = False) -> tuple[list[int], list[tuple[int, int]]]:
        out = self.tokenizer(text, add_special_tokens=special_tokens, return_offsets_mapping=True)
        return list(out["input_ids"]), [tuple(span) for span in out["offset_mapping"]]

    def decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids))


class ByteTokens:
    """One token per UTF-8 byte, as headcount's byte-level models read text."""

    kind, vocab_size, bos_first = "bytes", 256, False

    def encode(self, text: str, special_tokens: bool = False) -> tuple[list[int], list[tuple[int, int]]]:
        ids, spans = [], []
        for i, char in enumerate(text):
            for byte in char.encode():
                ids.append(byte)
                spans.append((i, i + 1))
        return ids, spans

    def decode(self, ids: Sequence[int]) -> str:
        return bytes(int(i) % 256 for i in ids).decode(errors="replace")


class IdsOnly:
    """A model of a synthetic alphabet: prompts and answers must be token ids."""

    kind, bos_first = "no tokenizer", False
    FIX = "give prompts and answers as token ids"

    def __init__(self, vocab_size: int, why: str, data_source: str | None = None):
        """data_source: the synthetic data the model was trained on (data.source), where known."""
        self.vocab_size, self.why, self.data_source = vocab_size, why, data_source

    def encode(self, text: str, special_tokens: bool = False) -> tuple[list[int], list[tuple[int, int]]]:
        raise ConfigError("task", text[:40], f"is text, but {self.why}: {self.FIX}")

    def decode(self, ids: Sequence[int]) -> str:
        return " ".join(str(int(i)) for i in ids)


def token_at(spans: list[tuple[int, int]], char: int) -> int:
    """The index of the token whose span covers character `char` (the first one, if several do)."""
    for index, (start, end) in enumerate(spans):
        if start <= char < end:
            return index
    raise ValueError(f"no token covers character {char}")


def one_token_answers(words: list[str], tokenizer: TaskTokenizer, key: str, at_least: int) -> tuple[list[str], str]:
    """The words a generator may use as answers (one token each), and the separator an answer follows at the end of a
    prompt: " " when " word" is one token (the space belongs to the answer), else "" when the tokenizer splits the space
    off (a byte-level one): the prompt then ends with the space and the answer is the bare word, one token itself.
    ConfigError naming `key` when fewer than `at_least` words qualify either way."""
    with_space = [w for w in words if len(tokenizer.encode(" " + w)[0]) == 1]
    if len(with_space) >= at_least:
        return with_space, " "
    space = tokenizer.encode(" ")[0]
    bare = [
        w
        for w in words
        if len(tokenizer.encode(w)[0]) == 1 and tokenizer.encode(" " + w)[0] == space + tokenizer.encode(w)[0]
    ]
    if len(bare) >= at_least:
        return bare, ""
    found = max(len(with_space), len(bare))
    raise ConfigError(
        key,
        words,
        f"needs {at_least} or more that are one token for {tokenizer.kind} (found {found}): "
        "give others (e.g. single characters for a byte-level model)",
    )
