"""`file`: the user's own prompts, one per row of a JSONL, JSON, CSV or Parquet file (`task.path`), or of a Hugging
Face dataset (`task.hub_name`, `task.hub_split`, `task.hub_config`), read through `datasets`.

A row holds (field names set by task.*_field):

    {"prompt": "The capital of France is", "answer": " Paris", "wrong": " Rome",
     "corrupted": "The capital of Italy is"}
    {"prompt": [0, 5, 9, 4, 5], "answer": 9, "wrong": 4, "corrupted": [0, 5, 7, 4, 5]}

prompt: text or a list of token ids; answer and wrong: text (encoded as written, leading space included) or a token
id; corrupted: the counterpart prompt, text or ids; position: the token index scored (negative from the end; default
the last token), or a list of them with a list of answers (and of wrong answers). Only prompt and answer are required.
"""

from pathlib import Path
from typing import Any

from headcount.config.task import TaskConfig
from headcount.errors import ConfigError
from headcount.tasks.prompts import TaskPrompt
from headcount.tasks.registry import SOURCES, TaskSource
from headcount.tasks.tokens import TaskTokenizer

FORMATS = {".jsonl": "json", ".json": "json", ".csv": "csv", ".parquet": "parquet"}


@SOURCES.register
class PromptFile(TaskSource):
    """your prompts: a JSONL, JSON, CSV or Parquet file, or a Hugging Face dataset"""

    name = "file"

    def default_name(self, cfg: TaskConfig) -> str:
        return Path(cfg.path).stem if cfg.path is not None else cfg.hub_name.rstrip("/").split("/")[-1]

    def prompts(self, cfg: TaskConfig, tokenizer: TaskTokenizer) -> list[TaskPrompt]:
        rows = read_rows(cfg)
        if cfg.n_prompts is not None:
            rows = rows.select(range(min(cfg.n_prompts, len(rows))))
        columns = set(rows.column_names)
        for field in ("prompt", "answer"):
            name = getattr(cfg, f"{field}_field")
            if name not in columns:
                raise ConfigError(
                    f"task.{field}_field",
                    name,
                    f"{where(cfg)} has no such field (its fields: {', '.join(sorted(columns)) or 'none'})",
                )
        return [row_prompt(row, i, cfg, columns) for i, row in enumerate(rows)]


def where(cfg: TaskConfig) -> str:
    return cfg.path if cfg.path is not None else f"the dataset {cfg.hub_name}"


def read_rows(cfg: TaskConfig) -> Any:
    """The rows as a datasets.Dataset (read without datasets' progress bars: a prompts file is small)."""
    import datasets  # datasets loads only when a task file is read

    shown = not datasets.are_progress_bars_disabled()
    datasets.disable_progress_bars()
    try:
        return load_rows(cfg, datasets.load_dataset)
    finally:
        if shown:
            datasets.enable_progress_bars()


def load_rows(cfg: TaskConfig, load_dataset: Any) -> Any:

    if cfg.hub_name is not None:
        try:
            return load_dataset(cfg.hub_name, cfg.hub_config, split=cfg.hub_split)
        except Exception as error:  # offline, unknown name, unknown split: datasets raises many kinds
            reason = str(error).strip().split("\n")[0]
            raise ConfigError(
                "task.hub_name",
                cfg.hub_name,
                f"cannot be read ({reason}); without a network only datasets in the local Hugging Face cache can",
            ) from None
    path = Path(cfg.path).expanduser()
    if not path.is_file():
        raise ConfigError("task.path", cfg.path, "no such file")
    builder = FORMATS.get(path.suffix.lower())
    if builder is None:
        raise ConfigError("task.path", cfg.path, f"allowed file types: {', '.join(FORMATS)}")
    if builder != "parquet" and not path.read_bytes().strip():
        raise ConfigError("task.path", cfg.path, "holds no prompts: a task needs at least one")
    try:
        return load_dataset(builder, data_files=str(path.resolve()), split="train")
    except Exception as error:  # a malformed file fails in Arrow's readers, in many ways
        cause = error.__cause__ or error
        reason = str(cause).strip().split("\n")[0] or type(cause).__name__
        raise ConfigError("task.path", cfg.path, f"does not read as {path.suffix} ({reason})") from None


def row_prompt(row: dict, index: int, cfg: TaskConfig, columns: set[str]) -> TaskPrompt:
    def field(name: str, required: bool = False) -> Any:
        value = row.get(getattr(cfg, f"{name}_field")) if getattr(cfg, f"{name}_field") in columns else None
        if required and value is None:
            raise ConfigError(
                f"task.{name}_field",
                getattr(cfg, f"{name}_field"),
                f"{where(cfg)}: row {index} has no value for this field",
            )
        return value

    prompt, answer, wrong, position = field("prompt", True), field("answer", True), field("wrong"), field("position")
    many = isinstance(answer, list)
    as_list = lambda value: None if value is None else list(value) if isinstance(value, list) else [value]  # noqa: E731
    if many != isinstance(position, list) and (many or position is not None):
        raise ConfigError(
            f"task.{'position' if many else 'answer'}_field",
            cfg.position_field,
            f"{where(cfg)}: row {index}: a list of answers needs a list of positions, one per answer",
        )
    return TaskPrompt(prompt, as_list(answer), as_list(wrong), field("corrupted"), as_list(position))
