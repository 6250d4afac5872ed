"""`ioi`: indirect object identification, after Wang et al. 2022 ("Interpretability in the wild").

"When Mary and John went to the store, John gave a drink to" -> " Mary" (the indirect object, IO) rather than
" John" (the subject, S, named twice). Prompts follow the paper's templates, the two names of the opening in either
order (ABBA and BABA alike, alternating), with a place and an object drawn per prompt. The corrupted prompt is the
paper's "S2 -> a third name" corruption: the subject's second mention becomes another name (C), so the sentence no
longer says who the indirect object is; clean and corrupted prompts have the same tokens count. Named positions:
IO, S1, S1+1 (the token after the first mention), S2 and end.

Every name is one token of the tokenizer the task is built for: of `task.names` (default: common first names) only
those that are one token with their leading space are used. For a tokenizer that splits the space off every name (a
byte-level one), the prompt ends with that space and the answer is the bare name, which then must be one token (give
single letters as task.names). Seeded and deterministic.
"""

import numpy as np

from headcount.config.task import TaskConfig
from headcount.tasks.prompts import TaskPrompt
from headcount.tasks.registry import SOURCES, TaskSource
from headcount.tasks.tokens import TaskTokenizer, one_token_answers

# [A] and [B] open the sentence (IO and S in either order); [S] is the subject's second mention.
TEMPLATES = (
    "Then, [A] and [B] went to the [PLACE]. [S] gave a [OBJECT] to",
    "Then, [A] and [B] had a lot of fun at the [PLACE]. [S] gave a [OBJECT] to",
    "Then, [A] and [B] were working at the [PLACE]. [S] decided to give a [OBJECT] to",
    "Then, [A] and [B] were thinking about going to the [PLACE]. [S] wanted to give a [OBJECT] to",
    "Then, [A] and [B] had a long argument, and afterwards [S] said to",
    "After [A] and [B] went to the [PLACE], [S] gave a [OBJECT] to",
    "When [A] and [B] got a [OBJECT] at the [PLACE], [S] decided to give it to",
    "When [A] and [B] got a [OBJECT] at the [PLACE], [S] decided to give the [OBJECT] to",
    "While [A] and [B] were working at the [PLACE], [S] gave a [OBJECT] to",
    "While [A] and [B] were commuting to the [PLACE], [S] gave a [OBJECT] to",
    "After the lunch, [A] and [B] went to the [PLACE]. [S] gave a [OBJECT] to",
    "Afterwards, [A] and [B] went to the [PLACE]. [S] gave a [OBJECT] to",
    "Then, [A] and [B] had a long argument. Afterwards [S] said to",
    "The [PLACE] [A] and [B] went to had a [OBJECT]. [S] gave it to",
    "Friends [A] and [B] found a [OBJECT] at the [PLACE]. [S] gave it to",
)
PLACES = ("store", "garden", "restaurant", "school", "hospital", "office", "house", "station")
OBJECTS = ("ring", "kiss", "bone", "basketball", "computer", "necklace", "drink", "snack")
NAMES = (
    "Mary", "John", "Tom", "James", "Dan", "Sarah", "Anne", "Paul", "Mark", "Lisa", "Kate", "Mike", "Jack", "Emma",
    "Alice", "Bob", "David", "Peter", "Laura", "Rachel", "Michael", "Daniel", "Andrew", "Joseph", "Thomas", "Robert",
    "Steven", "Kevin", "Brian", "George", "Edward", "Jason", "Jessica", "Jennifer", "Amy", "Emily", "Linda", "Susan",
    "Karen", "Nancy", "Helen", "Sandra", "Eric", "Adam", "Ryan", "Jacob", "Sam", "Max", "Ben", "Alex",
)  # fmt: skip
DEFAULT_PROMPTS = 64


@SOURCES.register
class IOI(TaskSource):
    """indirect object identification (Wang et al. 2022): who is given to, IO rather than the subject"""

    name = "ioi"

    def prompts(self, cfg: TaskConfig, tokenizer: TaskTokenizer) -> list[TaskPrompt]:
        names, sep = one_token_answers(list(cfg.names or NAMES), tokenizer, "task.names", 3)
        rng = np.random.default_rng(cfg.seed)
        return [self.prompt(i, rng, names, sep) for i in range(cfg.n_prompts or DEFAULT_PROMPTS)]

    @staticmethod
    def prompt(i: int, rng: np.random.Generator, names: list[str], sep: str) -> TaskPrompt:
        template = TEMPLATES[int(rng.integers(len(TEMPLATES)))]
        io, s, c = (names[j] for j in rng.choice(len(names), size=3, replace=False))
        first, second = (io, s) if i % 2 == 0 else (s, io)  # BABA and ABBA alternate
        words = {
            "[A]": first,
            "[B]": second,
            "[PLACE]": PLACES[int(rng.integers(len(PLACES)))],
            "[OBJECT]": OBJECTS[int(rng.integers(len(OBJECTS)))],
        }
        clean, marks = fill(template, {**words, "[S]": s})
        corrupted, _ = fill(template, {**words, "[S]": c})
        io_mark = marks["[A]"] if first == io else marks["[B]"]
        s1_mark = marks["[B]"] if first == io else marks["[A]"]
        named = {"IO": io_mark, "S1": s1_mark, "S1+1": s1_mark + 1, "S2": marks["[S]"]}
        ending = " " if sep == "" else ""
        return TaskPrompt(clean + ending, [sep + io], [sep + s], corrupted + ending, named=named)


def fill(template: str, words: dict[str, str]) -> tuple[str, dict[str, int]]:
    """The template with its slots filled, and the index of each slot's last character (its first fill)."""
    text, marks, rest = "", {}, template
    while "[" in rest:
        before, _, after = rest.partition("[")
        slot, _, rest = after.partition("]")
        text += before + words[f"[{slot}]"]
        marks.setdefault(f"[{slot}]", len(text) - 1)
    return text + rest, marks
