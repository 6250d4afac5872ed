"""The task section: prompts with right (and wrong) answers, and corrupted counterparts, that scans measure a behaviour
on instead of next-token loss over the run's data. `task=<name>` selects conf/task/<name>.yaml; no task (the default,
source null) means the run's own data.

Sources (headcount.tasks): `ioi` (indirect object identification, Wang et al. 2022), `kv_retrieval` ("key: value"
lines, then a key), `needle` (a passphrase in filler text, asked for at the end), and `file`: the user's own prompts,
a JSONL, JSON, CSV or Parquet file, or a Hugging Face dataset (`hub_name`), read through `datasets`.
"""

from dataclasses import dataclass

from headcount.config.choice import Choice, check_choice
from headcount.config.names import check_task_source
from headcount.errors import ConfigError


class AnswerTokens(Choice):
    first = "first"  # a multi-token answer is scored on its first token
    all = "all"  # every token of the answer is scored, teacher-forced after the prompt


class Align(Choice):
    exact = "exact"  # a clean prompt and its corrupted counterpart have the same tokens count; position t patches t
    last = "last"  # pairs of other lengths patch position t from the counterpart's t + (its length - this length)


@dataclass
class TaskConfig:
    source: str | None = None  # ioi | kv_retrieval | needle | file (headcount.tasks.SOURCES); null: no task
    name: str | None = None  # names the results folder ablation/tasks/<name>/ (default: the source, a file's stem)
    n_prompts: int | None = None  # generators: how many prompts (null: 64); a file: its first n rows (null: all)
    seed: int = 0  # the generators' random choices
    # file: a .jsonl, .json, .csv or .parquet file, or hub_name: a Hugging Face dataset (hub_split, hub_config)
    path: str | None = None
    hub_name: str | None = None
    hub_config: str | None = None
    hub_split: str = "train"
    # file: the field names of a row. prompt: text or a list of token ids; answer and wrong: text or a token id (a
    # list of them with several positions); corrupted: the counterpart prompt; position: the token index (or a list;
    # negative counts from the end) the answer is predicted at, default the prompt's last token.
    prompt_field: str = "prompt"
    answer_field: str = "answer"
    wrong_field: str = "wrong"
    corrupted_field: str = "corrupted"
    position_field: str = "position"
    csv_ids: bool = False  # a CSV's cells are text as written; true: token ids (integers separated by spaces)
    answer_tokens: AnswerTokens = AnswerTokens.first
    # Prompts encoded with the tokenizer's own special tokens (true) or as written (false); null: with them when the
    # tokenizer puts a beginning-of-sequence token first itself (Gemma's), as written otherwise (GPT-2's, SmolLM2's).
    add_special_tokens: bool | None = None
    align: Align = Align.exact
    # ioi: the names to draw from (default: a built-in list of common first names, those that are one token)
    names: list[str] | None = None
    # kv_retrieval: key-value lines per prompt; needle: filler sentences around the passphrase, and its words
    n_pairs: int = 4
    n_filler: int = 12
    needle_words: int = 4


def validate_task_config(cfg: TaskConfig, sources: list[str]) -> None:
    """What a task section can get wrong without reading data; `sources`: the registered task sources."""
    if cfg.source is None:
        return
    check_task_source(cfg.source, sources)
    check_choice("task.answer_tokens", cfg.answer_tokens, AnswerTokens)
    check_choice("task.align", cfg.align, Align)
    if cfg.n_prompts is not None and cfg.n_prompts < 1:
        raise ConfigError("task.n_prompts", cfg.n_prompts, "must be a positive integer or null (the default)")
    if cfg.source == "file" and (cfg.path is None) == (cfg.hub_name is None):
        given = "both" if cfg.path is not None else "neither"
        raise ConfigError("task.path", cfg.path, f"task=file reads task.path or task.hub_name ({given} given)")
    if cfg.name is not None and not cfg.name.replace("-", "").replace("_", "").replace(".", "").isalnum():
        raise ConfigError("task.name", cfg.name, "names a folder: letters, digits, '_', '-' and '.' only")
