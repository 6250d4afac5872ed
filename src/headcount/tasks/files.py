"""`file`: the user's own prompts, one per row of a JSONL, JSON, CSV or Parquet file (`task.path`), or of a Hugging
Face dataset (`task.hub_name`, `task.hub_split`, `task.hub_config`), read through `datasets`.

A row holds (field names set by task.*_field):

    {"prompt": "The capital of France is", "answer": " Paris", "wrong": " Rome",
     "corrupted": "The capital of Italy is"}
    {"prompt": [0, 5, 9, 4, 5], "answer": 9, "wrong": 4, "corrupted": [0, 5, 7, 4, 5]}

prompt: text or a list of token ids; answer and wrong: text (encoded as written, leading space included) or a token
id; corrupted: the counterpart prompt, text or ids; position: the token index scored (negative from the end; default
the last token), or a list of them with a list of answers (and of wrong answers). Only prompt and answer are required.

A CSV holds text: its cells are read as written (`7` is the text "7"), unless task.csv_ids=true, which reads them as
token ids (integers separated by spaces: a prompt's ids, or several answers and positions). A CSV row with another
number of fields than its header (an unquoted comma) is refused, naming it; an empty cell is no value.
"""

import csv
import logging
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from headcount.config.task import TaskConfig
from headcount.errors import ConfigError
from headcount.tasks.prompts import TaskPrompt
from headcount.tasks.registry import SOURCES, TaskSource
from headcount.tasks.tokens import TaskTokenizer

FORMATS = {".jsonl": "json", ".json": "json", ".csv": "csv", ".parquet": "parquet"}
FIELDS = ("prompt", "answer", "wrong", "corrupted", "position")
IDS = "a list of token ids"
KINDS = {  # what each field may hold, as a row's values come from JSON, Parquet or a dataset
    "prompt": ("text or " + IDS, lambda v: isinstance(v, str) or is_ids(v)),
    "corrupted": ("text or " + IDS, lambda v: isinstance(v, str) or is_ids(v)),
    "answer": ("text or a token id (a list of them with several positions)", lambda v: is_answers(v)),
    "wrong": ("text or a token id (a list of them with several positions)", lambda v: is_answers(v)),
    "position": ("a token index (an integer, or a list of them)", lambda v: is_id(v) or is_ids(v)),
}


def is_id(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def is_ids(value: Any) -> bool:
    return isinstance(value, list) and all(is_id(v) for v in value)


def is_answers(value: Any) -> bool:
    return isinstance(value, str) or is_id(value) or (isinstance(value, list) and all(is_answers(v) for v in value))


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
        # only the fields the task reads are decoded: another field's bad bytes or odd types are not the task's
        rows = rows.select_columns([name for f in FIELDS if (name := getattr(cfg, f"{f}_field")) in columns])
        values = [typed_row(row, i, cfg) for i, row in enumerate(each_row(rows, cfg))]
        return [row_prompt(row, i, cfg) for i, row in enumerate(values)]


def where(cfg: TaskConfig) -> str:
    return cfg.path if cfg.path is not None else f"the dataset {cfg.hub_name}"


def read_rows(cfg: TaskConfig) -> Any:
    """The rows as a datasets.Dataset (read without datasets' progress bars: a prompts file is small)."""
    import datasets  # datasets loads only when a task file is read

    shown, verbosity = not datasets.are_progress_bars_disabled(), datasets.logging.get_verbosity()
    datasets.disable_progress_bars()
    # datasets logs a file it cannot parse as an ERROR line before raising; the one line said is ours
    datasets.logging.set_verbosity(logging.CRITICAL)
    try:
        return load_rows(cfg, datasets.load_dataset)
    finally:
        datasets.logging.set_verbosity(verbosity)
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
    if path.is_dir():
        raise ConfigError("task.path", cfg.path, "is a folder, not a file")
    if not path.is_file():
        raise ConfigError("task.path", cfg.path, "no such file")
    builder = FORMATS.get(path.suffix.lower())
    if builder is None:
        raise ConfigError("task.path", cfg.path, f"allowed file types: {', '.join(FORMATS)}")
    if builder != "parquet" and not path.read_bytes().strip():
        raise ConfigError("task.path", cfg.path, "holds no prompts: a task needs at least one")
    if builder == "csv":
        return csv_rows(cfg, path)
    try:
        return load_dataset(builder, data_files=str(path.resolve()), split="train")
    except Exception as error:  # a malformed file fails in Arrow's readers, in many ways
        cause = error.__cause__ or error
        reason = str(cause).strip().split("\n")[0] or type(cause).__name__
        raise ConfigError("task.path", cfg.path, f"does not read as {path.suffix} ({reason})") from None


def csv_rows(cfg: TaskConfig, path: Path) -> Any:
    """A CSV's rows as text (an empty cell: no value), every row checked to have its header's fields. datasets' CSV
    reader (pandas) would infer numbers (`7` becoming token id 7) and take a row with one field too many as having an
    index column, shifting its fields silently."""
    import datasets

    with path.open(newline="", encoding="utf-8", errors="strict") as file:
        try:
            reader = csv.reader(file)
            header = next(reader)
            rows, line = [], reader.line_num
            for row in reader:
                if len(row) != len(header) and any(row):
                    raise ConfigError(
                        "task.path",
                        cfg.path,
                        f"row {len(rows)} (line {line + 1}) has {len(row)} fields, the header {len(header)} "
                        f"({', '.join(header)}): quote a field that holds a comma",
                    )
                if any(row):
                    rows.append(row)
                line = reader.line_num
        except (csv.Error, UnicodeDecodeError) as error:
            raise ConfigError("task.path", cfg.path, f"does not read as .csv ({error})") from None
    return datasets.Dataset.from_dict({name: [row[i] or None for row in rows] for i, name in enumerate(header)})


def each_row(rows: Any, cfg: TaskConfig) -> Iterator[dict]:
    for index in range(len(rows)):
        try:
            row = rows[index]
        except UnicodeDecodeError:  # Arrow decodes a row's text when it is read
            row = None
        if row is None:
            bad = next(name for name in rows.column_names if undecodable(rows, index, name))
            field = next(f for f in FIELDS if getattr(cfg, f"{f}_field") == bad)
            raise ConfigError(f"task.{field}_field", bad, f"{where(cfg)}: row {index} is not UTF-8 text")
        yield row


def undecodable(rows: Any, index: int, name: str) -> bool:
    try:
        rows.select_columns([name])[index]
    except UnicodeDecodeError:
        return True
    return False


def typed_row(row: dict, index: int, cfg: TaskConfig) -> dict:
    """The row's values, checked to be what each field may hold; NaN (a missing value in a column Arrow or pandas made
    floats) is no value, and such a column's whole floats are the integers they were."""
    typed = {}
    for field in FIELDS:
        name = getattr(cfg, f"{field}_field")
        value = row.get(name)
        if isinstance(value, float):
            value = None if math.isnan(value) else int(value) if value.is_integer() else value
        if isinstance(value, str) and cfg.csv_ids and Path(cfg.path or "").suffix.lower() == ".csv":
            value = csv_ids(value, field, index, cfg)
        if isinstance(value, dict) or (
            field == "prompt"
            and isinstance(value, list)
            and value
            and all(isinstance(v, str | list | dict) for v in value)
        ):
            raise ConfigError(
                "task.path" if cfg.path is not None else "task.hub_name",
                cfg.path or cfg.hub_name,
                "holds its fields as columns (one object whose prompt field holds every prompt: pandas' to_json() "
                "writes that): give one object per row, as JSONL or a JSON list of rows (to_json(orient='records'))",
            )
        kind, fits = KINDS[field]
        if value is not None and not fits(value):
            raise ConfigError(f"task.{field}_field", name, f"{where(cfg)}: row {index}: {value!r} is not {kind}")
        typed[field] = value
    return typed


def csv_ids(cell: str, field: str, index: int, cfg: TaskConfig) -> int | list[int]:
    """A CSV cell of token ids (task.csv_ids): integers separated by spaces; one id, except a prompt's."""
    try:
        ids = [int(part) for part in cell.split()]
    except ValueError:
        raise ConfigError(
            f"task.{field}_field",
            getattr(cfg, f"{field}_field"),
            f"{where(cfg)}: row {index}: {cell!r} is not token ids (task.csv_ids=true: integers separated by spaces)",
        ) from None
    return ids if field in ("prompt", "corrupted") or len(ids) != 1 else ids[0]


def row_prompt(row: dict, index: int, cfg: TaskConfig) -> TaskPrompt:
    def field(name: str, required: bool = False) -> Any:
        if required and row[name] is None:
            raise ConfigError(
                f"task.{name}_field",
                getattr(cfg, f"{name}_field"),
                f"{where(cfg)}: row {index} has no value for this field",
            )
        return row[name]

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
