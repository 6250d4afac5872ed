"""TaskPrompts -> a TaskSet in the model's tokens, with every check a task's prompts can fail, each a one-line
ConfigError naming the prompt's index: an empty task, an answer outside the vocabulary, a position outside the prompt,
a clean and corrupted pair of different lengths (unless task.align=last), a prompt longer than the model's context, an
answer and a wrong answer whose scored (first) tokens are the same (their logit difference would be 0 whatever the
model does). Answers without the leading space the tokenizer gives words are scored as written, and said once."""

from collections.abc import Sequence

import torch

from headcount.config.task import TaskConfig
from headcount.errors import ConfigError
from headcount.processes import console
from headcount.tasks.prompts import Answer, TaskPrompt, TaskSet
from headcount.tasks.tokens import IdsOnly, TaskTokenizer, token_at


class Encoder:
    def __init__(self, tokenizer: TaskTokenizer, cfg: TaskConfig, n_ctx: int, key: str):
        """key: the config key an error names (task.path for a file, task.source for a generator)."""
        self.tokenizer, self.cfg, self.n_ctx, self.key = tokenizer, cfg, n_ctx, key
        # task.add_special_tokens=null: the tokenizer's own special tokens where it puts a BOS first (Gemma needs it)
        special = cfg.add_special_tokens
        self.special_tokens = tokenizer.bos_first if special is None else special

    def fail(self, index: int, what: str) -> ConfigError:
        value = self.cfg.path or self.cfg.hub_name or self.cfg.source
        return ConfigError(self.key, value, f"prompt {index}: {what}")

    def encode(self, text: str, index: int, what: str, special: bool) -> tuple[list[int], list[tuple[int, int]]]:
        if isinstance(self.tokenizer, IdsOnly):
            raise self.fail(index, f"the {what} {text[:40]!r} is text, but {self.tokenizer.why}: {IdsOnly.FIX}")
        return self.tokenizer.encode(text, special)

    def tokens(self, text: str | list[int], index: int, what: str) -> tuple[list[int], list[tuple[int, int]] | None]:
        """(ids, character spans or None for an id prompt), ids checked against the vocabulary."""
        if isinstance(text, str):
            ids, spans = self.encode(text, index, what, self.special_tokens)
        else:
            ids, spans = list(text), None
        if not ids:
            raise self.fail(index, f"the {what} is empty")
        for i in ids:
            if not (isinstance(i, int) and 0 <= i < self.tokenizer.vocab_size):
                raise self.fail(
                    index, f"the {what} holds {i!r}, not a token id of the model (0..{self.tokenizer.vocab_size - 1})"
                )
        return ids, spans

    def answer(self, answer: Answer, index: int, what: str) -> list[int]:
        """An answer's ids: text encoded as written (no special tokens), or one id."""
        if isinstance(answer, str):
            ids, _ = self.encode(answer, index, what, False)
        else:
            ids = [answer]
        if not ids:
            raise self.fail(index, f"the {what} {answer!r} encodes to no token")
        for i in ids:
            if not (isinstance(i, int) and not isinstance(i, bool) and 0 <= i < self.tokenizer.vocab_size):
                top = self.tokenizer.vocab_size - 1
                raise self.fail(index, f"the {what} {answer!r} is not in the model's vocabulary (token ids 0..{top})")
        unk = getattr(getattr(self.tokenizer, "tokenizer", None), "unk_token_id", None)
        if unk is not None and unk in ids:
            raise self.fail(
                index, f"the {what} {answer!r} is not in the model's vocabulary (it encodes to the unknown token)"
            )
        return ids


def encode_task(
    prompts: Sequence[TaskPrompt], name: str, tokenizer: TaskTokenizer, cfg: TaskConfig, n_ctx: int, key: str
) -> TaskSet:
    if not prompts:
        raise ConfigError(key, cfg.path or cfg.hub_name or cfg.source, "holds no prompts: a task needs at least one")
    enc = Encoder(tokenizer, cfg, n_ctx, key)
    rows = [encode_prompt(enc, p, i) for i, p in enumerate(prompts)]
    if any(row["corrupted"] is None for row in rows) and any(row["corrupted"] is not None for row in rows):
        first = next(i for i, row in enumerate(rows) if row["corrupted"] is None)
        raise enc.fail(first, f"has no corrupted prompt ({cfg.corrupted_field}), and others have: give all or none")
    if any(row["wrong"] is None for row in rows) and any(row["wrong"] is not None for row in rows):
        first = next(i for i, row in enumerate(rows) if row["wrong"] is None)
        raise enc.fail(first, f"has no wrong answer ({cfg.wrong_field}), and others have: give all or none")
    note_answers_without_space(enc, prompts)
    return stack(rows, name, tokenizer, enc.special_tokens)


def note_answers_without_space(enc: Encoder, prompts: Sequence[TaskPrompt]) -> None:
    """One line when answers that follow a text prompt at its end lack the space the tokenizer starts a word with
    ("Paris" after "... is", where " Paris" is its own token): scored as written, most likely not what was meant. A
    tokenizer that splits the space off (bytes) makes the bare word right, and says nothing."""
    if isinstance(enc.tokenizer, IdsOnly):
        return
    at_end = [
        a
        for p in prompts
        if isinstance(p.prompt, str) and p.positions is None and p.prompt[-1:] != " "
        for a in [*p.answers, *(p.wrongs or [])]
        if isinstance(a, str)
    ]
    space = enc.tokenizer.encode(" ")[0][:1]
    bare = [a for a in at_end if a[:1].strip() and welded_space(enc.tokenizer, a, space)]
    if bare:
        console().print(
            f"[yellow]note:[/yellow] {enc.key}={enc.cfg.path or enc.cfg.hub_name or enc.cfg.source!r}: {len(bare)} of "
            f"{len(at_end)} answers have no leading space (e.g. {bare[0]!r}), where {enc.tokenizer.kind} makes "
            f"{' ' + bare[0]!r} another token: they are scored as written",
            highlight=False,
            soft_wrap=True,
            markup=True,
        )


def welded_space(tokenizer: TaskTokenizer, answer: str, space: list[int]) -> bool:
    """Whether " answer" starts with a token of its own, neither the space alone nor the bare answer's first."""
    spaced, bare = tokenizer.encode(" " + answer)[0][:1], tokenizer.encode(answer)[0][:1]
    return spaced != space and spaced != bare


def encode_prompt(enc: Encoder, p: TaskPrompt, index: int) -> dict:
    cfg = enc.cfg
    ids, spans = enc.tokens(p.prompt, index, "prompt")
    n = len(ids)
    answers = [enc.answer(a, index, "answer") for a in p.answers]
    wrongs = None if p.wrongs is None else [enc.answer(w, index, "wrong answer") for w in p.wrongs]
    if wrongs is not None and len(wrongs) != len(answers):
        raise enc.fail(index, f"has {len(answers)} answers but {len(wrongs)} wrong answers: give one per position")
    if p.positions is None:
        positions = [n - 1]
    else:
        positions = [pos + n if pos < 0 else pos for pos in p.positions]
        bad = [pos for pos, given in zip(positions, p.positions) if not 0 <= pos < n]
        if bad:
            raise enc.fail(index, f"position {p.positions[positions.index(bad[0])]} is outside its {n} tokens")
    if len(set(positions)) != len(positions):
        raise enc.fail(index, f"names position {positions} twice: each scored position once")
    if len(positions) != len(answers):
        raise enc.fail(
            index, f"has {len(positions)} scored positions but {len(answers)} answers: give one per position"
        )
    if cfg.answer_tokens == "all":
        if p.positions is not None or len(answers) != 1:
            raise enc.fail(
                index,
                "task.answer_tokens=all scores one answer after the prompt's last token: "
                "give one answer and no positions",
            )
        if wrongs is not None:
            raise enc.fail(
                index,
                "task.answer_tokens=all scores the correct answer, teacher-forced; a task with "
                "wrong answers is scored on their first token (task.answer_tokens=first)",
            )
        extra = answers[0][:-1]
        positions = list(range(n - 1, n + len(extra)))
        answer_ids = answers[0]
    else:
        extra = []
        answer_ids = [a[0] for a in answers]
    wrong_ids = None if wrongs is None else [w[0] for w in wrongs]
    for answer, wrong, a, w in zip(p.answers, p.wrongs or [], answer_ids, wrong_ids or []):
        if a == w:  # the logit difference of one token with itself: 0 for every mask, a silently empty result
            shown = enc.tokenizer.decode([a])
            raise enc.fail(
                index,
                f"the answer {answer!r} and the wrong answer {wrong!r} both start with token {a} ({shown!r}), the "
                "token scored: their logit difference is 0 whatever the model does; end the prompt with the text "
                "they share and give the rest as answers, or choose answers whose first tokens differ",
            )
    corrupted = None
    if p.corrupted is not None:
        corrupted, _ = enc.tokens(p.corrupted, index, "corrupted prompt")
        if len(corrupted) != n and cfg.align == "exact":
            raise enc.fail(
                index,
                f"the clean prompt has {n} tokens and the corrupted one {len(corrupted)}: patching "
                "needs equal lengths (or task.align=last, last-position-aligned patching)",
            )
        corrupted = corrupted + extra
    full = ids + extra
    longest = max(len(full), len(corrupted or []))
    if longest > enc.n_ctx:
        raise enc.fail(index, f"has {longest} tokens, more than the model's context ({enc.n_ctx})")
    named = {"end": n - 1}
    for label, where in p.named.items():
        named[label] = where if spans is None else token_at(spans, where)
    source, corrupted_source = encode_source(enc, p, index)
    return {
        "source": source,
        "corrupted_source": corrupted_source,
        "ids": full,
        "positions": positions,
        "answers": answer_ids,
        "wrong": wrong_ids,
        "corrupted": corrupted,
        "named": named,
        "text": p.prompt if isinstance(p.prompt, str) else None,
    }


def encode_source(enc: Encoder, p: TaskPrompt, index: int) -> tuple[list[int] | None, list[int] | None]:
    """An encoder-decoder's source and its counterpart's (token ids), checked: in the vocabulary, within the model's
    context, and of one length (the encoder's positions patch position by position)."""
    if p.source is None:
        return None, None
    source, _ = enc.tokens(p.source, index, "source")
    corrupted = None
    if p.corrupted_source is not None:
        corrupted, _ = enc.tokens(p.corrupted_source, index, "corrupted source")
        if len(corrupted) != len(source):
            raise enc.fail(
                index, f"the source has {len(source)} tokens and the corrupted one {len(corrupted)}: give equal lengths"
            )
    if len(source) > enc.n_ctx:
        raise enc.fail(index, f"its source has {len(source)} tokens, more than the model's context ({enc.n_ctx})")
    return source, corrupted


def stack_sources(rows: list[dict]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None] | None:
    """An encoder-decoder's sources (N, S) right-padded with 0, their lengths and the counterparts' sources."""
    if rows[0]["source"] is None:
        return None
    S = max(len(r["source"]) for r in rows)
    src_ids = torch.zeros(len(rows), S, dtype=torch.long)
    corrupted = torch.zeros(len(rows), S, dtype=torch.long) if rows[0]["corrupted_source"] is not None else None
    for i, r in enumerate(rows):
        src_ids[i, : len(r["source"])] = torch.tensor(r["source"])
        if corrupted is not None:
            corrupted[i, : len(r["corrupted_source"])] = torch.tensor(r["corrupted_source"])
    return src_ids, torch.tensor([len(r["source"]) for r in rows]), corrupted


def stack(rows: list[dict], name: str, tokenizer: TaskTokenizer, special_tokens: bool) -> TaskSet:
    N = len(rows)
    T = max(max(len(r["ids"]), len(r["corrupted"] or [])) for r in rows)
    input_ids = torch.zeros(N, T, dtype=torch.long)
    score_mask = torch.zeros(N, T, dtype=torch.bool)
    answer_ids = torch.zeros(N, T, dtype=torch.long)
    has_wrong, has_corrupted = rows[0]["wrong"] is not None, rows[0]["corrupted"] is not None
    wrong_ids = torch.zeros(N, T, dtype=torch.long) if has_wrong else None
    corrupted_ids = torch.zeros(N, T, dtype=torch.long) if has_corrupted else None
    labels = list(dict.fromkeys(label for r in rows for label in r["named"]))
    positions = {label: torch.full((N,), -1, dtype=torch.long) for label in labels}
    for i, r in enumerate(rows):
        input_ids[i, : len(r["ids"])] = torch.tensor(r["ids"])
        score_mask[i, r["positions"]] = True
        answer_ids[i, r["positions"]] = torch.tensor(r["answers"])
        if has_wrong:
            wrong_ids[i, r["positions"]] = torch.tensor(r["wrong"])
        if has_corrupted:
            corrupted_ids[i, : len(r["corrupted"])] = torch.tensor(r["corrupted"])
        for label, pos in r["named"].items():
            positions[label][i] = pos
    lengths = torch.tensor([len(r["ids"]) for r in rows])
    corrupted_lengths = torch.tensor([len(r["corrupted"]) for r in rows]) if has_corrupted else None
    texts = [r["text"] if r["text"] is not None else tokenizer.decode(r["ids"]) for r in rows]
    return TaskSet(
        name,
        input_ids,
        lengths,
        score_mask,
        answer_ids,
        wrong_ids,
        corrupted_ids,
        corrupted_lengths,
        positions,
        texts,
        special_tokens,
        *(stack_sources(rows) or ()),
    )
