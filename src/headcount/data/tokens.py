"""Documents -> (n_chunks, seq_len) token ids: bytes (one token per byte), or a pretrained model's tokenizer.

The data layer does not know where a tokenizer comes from (headcount.pretrained wraps a checkpoint's): it needs its
identity (part of every cache key, so text tokenized differently is never mixed up), its vocabulary size and a way to
encode documents.
"""

from collections.abc import Iterable, Iterator
from typing import Any, Protocol

import numpy as np

from headcount.data.chunking import byte_chunks, join_documents

ENCODE_BATCH = 64  # documents per call of the tokenizer (a fast tokenizer encodes a batch in parallel)


class TextTokenizer(Protocol):
    identity: str  # stable across processes: what the tokenizer maps text to
    vocab_size: int  # token ids lie in [0, vocab_size)

    def encode(self, documents: list[bytes]) -> list[list[int]]:
        """Each document's token ids, a document separator (end-of-text) after each where the tokenizer has one."""
        ...


def puts_bos_first(tokenizer: Any) -> bool:
    """Whether a transformers tokenizer's own encoding starts with its beginning-of-sequence token (Gemma's does:
    the model was trained with it and is far from itself without it; GPT-2's and SmolLM2's do not)."""
    bos = getattr(tokenizer, "bos_token_id", None)
    if bos is None:
        return False
    ids = tokenizer("a")["input_ids"]
    return bool(ids) and ids[0] == bos and tokenizer("a", add_special_tokens=False)["input_ids"][:1] != [bos]


def cache_fields(tokenizer: TextTokenizer | None) -> dict:
    """What a cache key adds for the tokenizer: nothing for bytes (the keys of byte-level entries stay as they were)."""
    return {} if tokenizer is None else {"tokenizer": tokenizer.identity}


def token_chunks(
    documents: Iterable[bytes], seq_len: int, tokenizer: TextTokenizer | None, max_chunks: int | None = None
) -> np.ndarray:
    """(n_chunks, seq_len) int64 ids of the documents joined, the short tail dropped; reads documents only until
    max_chunks chunks are in hand (when given)."""
    if tokenizer is None:
        return byte_chunks(join_documents(documents, None if max_chunks is None else max_chunks * seq_len), seq_len)
    ids: list[int] = []
    for batch in _batches(documents):
        for encoded in tokenizer.encode(batch):
            ids.extend(encoded)
        if max_chunks is not None and len(ids) >= max_chunks * seq_len:
            break
    n_chunks = len(ids) // seq_len
    if max_chunks is not None:
        n_chunks = min(n_chunks, max_chunks)
    return np.asarray(ids[: n_chunks * seq_len], dtype=np.int64).reshape(n_chunks, seq_len)


def _batches(documents: Iterable[bytes]) -> Iterator[list[bytes]]:
    batch: list[bytes] = []
    for document in documents:
        batch.append(document)
        if len(batch) == ENCODE_BATCH:
            yield batch
            batch = []
    if batch:
        yield batch
