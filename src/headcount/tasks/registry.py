"""Task sources as components: each makes a task's prompts (`TaskPrompt`s) for the tokenizer it will be encoded with.
A source is a `TaskSource` subclass registered in `SOURCES` under its `name`, the value task.source takes."""

from typing import ClassVar

from headcount.config.task import TaskConfig
from headcount.registry import Registry
from headcount.tasks.prompts import TaskPrompt
from headcount.tasks.tokens import TaskTokenizer


class TaskSource:
    name: ClassVar[str]
    masked_lm: ClassVar[bool] = False  # scores an encoder's mask positions, not a decoder's next tokens
    seq2seq: ClassVar[bool] = False  # scores an encoder-decoder's teacher-forced target given a source
    writes_ids: ClassVar[bool] = False  # its prompts are token ids (a model without a tokenizer reads them)

    def prompts(self, cfg: TaskConfig, tokenizer: TaskTokenizer) -> list[TaskPrompt]:
        raise NotImplementedError

    def default_name(self, cfg: TaskConfig) -> str:
        """The results folder's name when task.name is unset."""
        return self.name


SOURCES: Registry[type[TaskSource]] = Registry("task source", "task.source", "where a task's prompts come from")
