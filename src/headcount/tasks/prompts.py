"""A task's prompts before tokenisation, as generators and files give them, and the encoded set the evaluator reads.

A prompt is text or a list of token ids. It is scored at one or more positions (default: its last token), each with a
correct answer and optionally a wrong one (text or a token id; text is encoded as written, leading space included,
and a multi-token answer is scored on its first token unless task.answer_tokens=all). It may have a corrupted
counterpart and named positions (IOI's "S2", retrieval's "key"): characters of a text prompt, or token indices of an
id prompt, turned into token positions when encoded.

An encoder-decoder's task (a source with `seq2seq`, tasks/translation_verb.py) gives each prompt a source sentence as
token ids (`source`, the encoder's input) and its counterpart's (`corrupted_source`); the prompt is then the decoder's
stream, teacher-forced: its start token and the target's tokens so far.
"""

import hashlib
from dataclasses import dataclass, field

import torch
from torch import Tensor

Answer = str | int


@dataclass
class TaskPrompt:
    prompt: str | list[int]
    answers: list[Answer]  # one per scored position
    wrongs: list[Answer] | None = None  # one per scored position, or none
    corrupted: str | list[int] | None = None
    positions: list[int] | None = None  # token indices scored (negative: from the end); None: the last token
    named: dict[str, int] = field(default_factory=dict)  # name -> a character (text) or token index (ids) it marks
    source: list[int] | None = None  # an encoder-decoder's: the encoder's input (token ids)
    corrupted_source: list[int] | None = None  # and the counterpart's


@dataclass
class TaskSet:
    """A task encoded for one model: N prompts right-padded to T tokens. Right padding is exact for a causal model:
    no position attends to the padding after it, and positions keep their indices (learned or rotary alike)."""

    name: str
    input_ids: Tensor  # (N, T) int64, padding 0 past each prompt's length
    lengths: Tensor  # (N,)
    score_mask: Tensor  # (N, T) bool: positions whose prediction is scored
    answer_ids: Tensor  # (N, T): the correct next token at scored positions
    wrong_ids: Tensor | None  # (N, T): the wrong one, where the task has them
    corrupted_ids: Tensor | None  # (N, T) the counterparts, padded alike
    corrupted_lengths: Tensor | None  # (N,)
    positions: dict[str, Tensor]  # name -> (N,) token index in the prompt, -1 where a prompt lacks it; "end" always
    texts: list[str]  # each prompt as text, for tables and figures
    special_tokens: bool = False  # encoded with the tokenizer's own special tokens (task.add_special_tokens)
    # an encoder-decoder's task: the sources (N, S) right-padded with 0, their lengths, the counterparts' sources
    src_ids: Tensor | None = None
    src_lengths: Tensor | None = None
    corrupted_src_ids: Tensor | None = None

    def __len__(self) -> int:
        return len(self.input_ids)

    @property
    def has_wrong(self) -> bool:
        return self.wrong_ids is not None

    @property
    def has_corrupted(self) -> bool:
        return self.corrupted_ids is not None

    @property
    def seq2seq(self) -> bool:
        """Whether the prompts are an encoder-decoder's: a source each, the prompt its decoder's stream."""
        return self.src_ids is not None

    @property
    def shift(self) -> Tensor:
        """(N,) how far a position of a prompt lies from its counterpart's (last-position alignment; 0 when equal)."""
        return self.corrupted_lengths - self.lengths

    def first(self, n: int | None) -> "TaskSet":
        """The first n prompts (all when n is None)."""
        if n is None or n >= len(self):
            return self
        cut = lambda t: None if t is None else t[:n]  # noqa: E731
        return TaskSet(
            self.name,
            self.input_ids[:n],
            self.lengths[:n],
            self.score_mask[:n],
            self.answer_ids[:n],
            cut(self.wrong_ids),
            cut(self.corrupted_ids),
            cut(self.corrupted_lengths),
            {name: t[:n] for name, t in self.positions.items()},
            self.texts[:n],
            self.special_tokens,
            cut(self.src_ids),
            cut(self.src_lengths),
            cut(self.corrupted_src_ids),
        )

    def examples(self, corrupted: bool = False) -> dict[str, Tensor]:
        """What the evaluator reads: input_ids, the score points (score_mask, answer_ids, wrong_ids), valid (B, T)
        (positions inside a prompt) and named_pos (B, K), of the clean prompts or of their counterparts, scored with
        the clean prompts' answers at the corresponding positions; an encoder-decoder's also src_ids and src_mask
        (B, S), the clean sources or the counterparts'."""
        ids, lengths = (self.corrupted_ids, self.corrupted_lengths) if corrupted else (self.input_ids, self.lengths)
        score_mask, answer_ids, wrong_ids = self.score_mask, self.answer_ids, self.wrong_ids
        named = torch.stack(list(self.positions.values()), dim=1)
        if corrupted and bool((self.shift != 0).any()):
            score_mask, answer_ids = shifted(score_mask, self.shift), shifted(answer_ids, self.shift)
            wrong_ids = None if wrong_ids is None else shifted(wrong_ids, self.shift)
            named = torch.where(named >= 0, named + self.shift[:, None], named)
            named = torch.where(named < lengths[:, None], named, -1)
        T = ids.shape[1]
        examples = {
            "input_ids": ids,
            "score_mask": score_mask,
            "answer_ids": answer_ids,
            "valid": torch.arange(T)[None] < lengths[:, None],
            "named_pos": named,
        }
        if self.seq2seq:
            src_ids = self.corrupted_src_ids if corrupted else self.src_ids
            S = src_ids.shape[1]
            examples |= {"src_ids": src_ids, "src_mask": torch.arange(S)[None] < self.src_lengths[:, None]}
        return examples if wrong_ids is None else {**examples, "wrong_ids": wrong_ids}

    def fingerprint(self) -> dict:
        """What the task's results depend on: a hash of every token, answer and position, its size, and whether the
        tokenizer's special tokens were added (said only when they were, so that earlier records still match)."""
        digest = hashlib.sha256()
        tensors = (self.input_ids, self.score_mask, self.answer_ids, self.wrong_ids, self.corrupted_ids)
        for tensor in (*tensors, self.src_ids, self.corrupted_src_ids):
            if tensor is not None:
                digest.update(tensor.contiguous().numpy().tobytes())
        for name, tensor in self.positions.items():
            digest.update(name.encode() + tensor.contiguous().numpy().tobytes())
        record = {"task": self.name, "prompts": len(self), "tokens": digest.hexdigest()[:16]}
        return {**record, "special_tokens": True} if self.special_tokens else record


def shifted(values_NT: Tensor, shift_N: Tensor) -> Tensor:
    """Each row moved right by its shift (left where negative), filled with zeros (False)."""
    T = values_NT.shape[1]
    source_NT = torch.arange(T)[None] - shift_N[:, None]
    inside_NT = (source_NT >= 0) & (source_NT < T)
    moved = values_NT.gather(1, source_NT.clamp(0, T - 1))
    return torch.where(inside_NT, moved, torch.zeros_like(moved))
