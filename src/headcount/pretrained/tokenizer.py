"""A checkpoint's transformers tokenizer as the data layer's TextTokenizer (headcount.data.tokens)."""

import hashlib
import json
from typing import Any

# Bytes that a byte-level tokenizer maps to themselves: how `is_byte_level` recognises one.
PROBE = bytes(range(32, 127))


class PretrainedTokenizer:
    """Encodes UTF-8 documents (undecodable bytes replaced) without special tokens, an end-of-text token after each
    document where the tokenizer has one, as language models see concatenated documents; with bos, the tokenizer's
    beginning-of-sequence token before each (data.add_bos: a model trained with it, Gemma, needs it)."""

    def __init__(self, tokenizer: Any, source: str, bos: bool = False):
        self.tokenizer, self.source = tokenizer, source
        self.vocab_size = len(tokenizer)  # added tokens included
        self.bos = [tokenizer.bos_token_id] if bos else []
        # Text encoded with a BOS is other tokens: another identity, so that cached splits never mix the two
        self.identity = tokenizer_identity(tokenizer) + ("+bos" if bos else "")

    def encode(self, documents: list[bytes]) -> list[list[int]]:
        texts = [document.decode("utf-8", errors="replace") for document in documents]
        encoded = self.tokenizer(texts, add_special_tokens=False)["input_ids"]
        eos = self.tokenizer.eos_token_id
        return [self.bos + ids + ([eos] if eos is not None else []) for ids in encoded]

    def is_byte_level(self) -> bool:
        """Token id = byte value: byte-level data means the same to this model."""
        return self.tokenizer(PROBE.decode(), add_special_tokens=False)["input_ids"] == list(PROBE)


def tokenizer_identity(tokenizer: Any) -> str:
    """sha256 of the tokenizer's full definition (a fast tokenizer's JSON; else its vocabulary), 16 hex digits."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    text = backend.to_str() if backend is not None else json.dumps(sorted(tokenizer.get_vocab().items()))
    return hashlib.sha256(text.encode()).hexdigest()[:16]
