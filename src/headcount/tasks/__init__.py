"""Tasks: prompts with a right answer (and a wrong one), and corrupted counterparts, that ablation scans measure a
behaviour on (headcount.ablation.engine.metrics: logit_diff, answer_logprob, ...) instead of next-token loss.

`build_task(cfg, tokenizer, n_ctx)` makes the prompts of task.source (a registered `TaskSource`: ioi, kv_retrieval,
needle, file) and encodes them for the model (tasks/encode.py). Adding a source is one module here with a registered
`TaskSource` subclass.
"""

import pkgutil
from importlib import import_module

from headcount.config.task import TaskConfig, validate_task_config
from headcount.errors import ConfigError
from headcount.tasks.encode import encode_task
from headcount.tasks.prompts import TaskPrompt, TaskSet
from headcount.tasks.registry import SOURCES, TaskSource
from headcount.tasks.tokens import ByteTokens, HFTokens, IdsOnly, TaskTokenizer

for _module in pkgutil.iter_modules(__path__):
    import_module(f"{__name__}.{_module.name}")

__all__ = [
    "SOURCES",
    "ByteTokens",
    "HFTokens",
    "IdsOnly",
    "TaskPrompt",
    "TaskSet",
    "TaskSource",
    "TaskTokenizer",
    "build_task",
    "task_name",
]


def task_name(cfg: TaskConfig) -> str:
    """The results folder's name: task.name, else the source's default (the source, a file's stem)."""
    return cfg.name or SOURCES.get(cfg.source)().default_name(cfg)


def build_task(cfg: TaskConfig, tokenizer: TaskTokenizer, n_ctx: int) -> TaskSet:
    """The task's prompts in the model's tokens; ConfigError (one line, naming the key and the prompt) for bad input."""
    validate_task_config(cfg, list(SOURCES))
    source = SOURCES.get(cfg.source)()
    if isinstance(tokenizer, IdsOnly) and cfg.source != "file" and not source.writes_ids:
        raise ConfigError(
            "task.source",
            cfg.source,
            f"writes text prompts, but {tokenizer.why}: use task=file with prompts and answers as token ids",
        )
    key = "task.path" if cfg.source == "file" and cfg.path is not None else "task.source"
    key = "task.hub_name" if cfg.source == "file" and cfg.hub_name is not None else key
    return encode_task(source.prompts(cfg, tokenizer), task_name(cfg), tokenizer, cfg, n_ctx, key)
