"""What masks are evaluated on, under ablation settings, and the evaluator on it: what a scan session and the Python
API's `Run.evaluate` both build, the same way, so that masks evaluated either way give the same numbers.

The evaluation set is the run's own data (the first n_eval examples of ablation.split, next-token loss over its
targets; an encoder's masked-LM points instead, train/masking.py) or a task's prompts (task.*: scored at their
answers' positions), with the reference set the mode draws on (mean, resample) and, for a task with corrupted
prompts, the counterparts: the other end of its clean-to-corrupted gap.
"""

from dataclasses import dataclass

import torch
from omegaconf import DictConfig, OmegaConf
from rich.console import Console
from torch import Tensor

from headcount.ablation.engine.evaluator import MaskEvaluator, MaskTotals
from headcount.ablation.engine.metrics import Metric, Targets
from headcount.ablation.engine.modes import AblationMode, Replacements, ReplacementStore
from headcount.ablation.engine.seq2seq_evaluator import Seq2SeqEvaluator
from headcount.config import typed
from headcount.config.ablation import AblationConfig
from headcount.config.task import TaskConfig
from headcount.data.examples import to_batches
from headcount.errors import ConfigError
from headcount.model.encoder_decoder import EncoderDecoder
from headcount.model.transformer import Transformer
from headcount.run_dir import FinishedRun
from headcount.tasks import ByteTokens, HFTokens, IdsOnly, TaskSet, TaskTokenizer, build_task
from headcount.train.masking import masked_points, masking_for

TASK_REFERENCES = ("prompts", "corrupted")


@dataclass
class EvaluationSet:
    examples: dict[str, Tensor]  # input_ids (N, T) and loss_mask, or a task's score points; sources once prepared
    reference: dict[str, Tensor] | None  # what mean and resample draw on, else None
    split: str  # what examples are: a split of the run's data, or a task's "prompts" ("corrupted" when denoising)
    reference_split: str | None
    task: TaskSet | None = None
    counterpart: dict[str, Tensor] | None = None  # a task's other end of the gap: corrupted prompts (clean: denoise)
    masked_lm: dict | None = None  # an encoder's: the masking its score points come from (train/masking.py)

    @property
    def positions(self) -> list[str]:
        """The task's named positions, in the order of the examples' named_pos columns."""
        return [] if self.task is None else list(self.task.positions)

    def fingerprint(self) -> dict:
        return {} if self.task is None else self.task.fingerprint()


def reference_split(s: AblationConfig, task: TaskSet | None) -> str:
    """ablation.reference_split with its default: train for the run's data, the prompts for a task."""
    if task is None:
        return s.reference_split or "train"
    chosen = s.reference_split or "prompts"
    if chosen not in TASK_REFERENCES:
        raise ConfigError("ablation.reference_split", chosen, f"on a task, allowed: {', '.join(TASK_REFERENCES)}")
    if chosen == "corrupted" and not task.has_corrupted:
        raise ConfigError("ablation.reference_split", chosen, "the task has no corrupted prompts")
    return chosen


def evaluation_set(run: FinishedRun, s: AblationConfig, mode: AblationMode, task: TaskSet | None) -> EvaluationSet:
    """The first n_eval examples of s.split (or prompts of the task) and, for a mode that needs it, the reference
    set: the first n_reference examples of the reference split, or the task's prompts (or their counterparts)."""
    if task is not None:
        return task_evaluation_set(task, s, mode)
    reference_name = reference_split(s, None)
    examples = run.examples(s.split, s.n_eval, "ablation.split")
    if s.n_eval is not None and len(examples["input_ids"]) < s.n_eval:
        said_fewer(f"the {s.split} split holds", s.n_eval, len(examples["input_ids"]))
    reference = None
    if mode.uses_reference:
        reference = run.examples(reference_name, s.n_reference, "ablation.reference_split")
    masked_lm = None
    if not run.model.cfg.causal:  # an encoder is scored on masked-LM points, the same masks for the same seed
        masking = masking_for(run.config, run.model.cfg.vocab_size)
        examples = masked_points(examples, masking, s.seed)
        if reference is not None:  # what mean and resample draw on is corrupted the same way, by its own draw
            reference = {**reference, "input_ids": masked_points(reference, masking, s.seed + 1)["input_ids"]}
        masked_lm = {**masking.record(), "seed": s.seed}
    return EvaluationSet(
        examples, reference, s.split, reference_name if mode.uses_reference else None, masked_lm=masked_lm
    )


def task_evaluation_set(task: TaskSet, s: AblationConfig, mode: AblationMode) -> EvaluationSet:
    """A task's first n_eval prompts (their counterparts when denoising), the reference set the mode draws on (the
    prompts or their counterparts) and the other end of the gap."""
    reference_name = reference_split(s, task)
    if s.n_eval is not None and len(task) < s.n_eval:
        said_fewer(f"task {task.name} holds", s.n_eval, len(task))
    task = task.first(s.n_eval)
    denoise = mode.evaluates_corrupted(s)
    examples = task.examples(corrupted=denoise)
    reference = None
    if mode.uses_reference:
        chosen = task.examples(corrupted=reference_name == "corrupted")
        kept = ("input_ids", "valid", "src_ids", "src_mask")  # an encoder-decoder's sources pair with its prompts
        reference = {key: chosen[key] for key in kept if key in chosen}
    counterpart = task.examples(corrupted=not denoise) if task.has_corrupted else None
    split = "corrupted" if denoise else "prompts"
    return EvaluationSet(examples, reference, split, reference_name if mode.uses_reference else None, task, counterpart)


def said_fewer(what: str, asked: int, used: int) -> None:
    """Not an error (a smoke-sized split under an experiment's n_eval): the tables record the number evaluated."""
    Console(stderr=True).print(
        f"[yellow]note:[/yellow] ablation.n_eval={asked} is more than {what}: evaluated all {used} of its examples",
        highlight=False,
        soft_wrap=True,
    )


@dataclass
class Evaluation:
    replacements: Replacements
    batches: list[dict[str, Tensor]]  # the evaluation set in ablation.batch_size batches, on the model's device
    evaluator: MaskEvaluator


def evaluation(
    s: AblationConfig,
    mode: AblationMode,
    metric: Metric,
    model: Transformer,
    data: EvaluationSet,
    files: ReplacementStore | None,
    device: torch.device,
) -> Evaluation:
    """The mode's replacements (saved in and read back from `files`; files=None keeps them in memory), the eval
    batches and the evaluator, sized by s.masks_per_pass or s.memory_budget_mb."""
    replacements = mode.prepare(s, model, data, files)
    batches = to_batches(data.examples, s.batch_size, device)
    budget = None if s.memory_budget_mb is None else s.memory_budget_mb * 2**20
    if isinstance(model, EncoderDecoder):  # its heads as one grid of three kinds (seq2seq_evaluator.py)
        evaluator = Seq2SeqEvaluator(model, batches, replacements, s.masks_per_pass, budget, metric=metric)
    else:
        evaluator = MaskEvaluator(model, batches, replacements, s.masks_per_pass, budget, metric=metric)
    return Evaluation(replacements, batches, evaluator)


def plain_evaluator(model: Transformer, batches: list[dict[str, Tensor]], metric: Metric) -> MaskEvaluator:
    """An evaluator of the plain model, one mask per pass (an encoder-decoder's over its grid of three kinds)."""
    Evaluator = Seq2SeqEvaluator if isinstance(model, EncoderDecoder) else MaskEvaluator
    return Evaluator(model, batches, masks_per_pass=1, metric=metric)


@dataclass
class CounterpartSums:
    """The unmasked model on a task's counterpart prompts, the other end of the gap: each metric column (and
    n_targets), and per counterpart (in the prompts' order) its primary column summed over its score points and its
    points: what a bootstrap over the prompts resamples the gap by (ablation/scans/intervals.py)."""

    baseline: dict[str, float]
    examples_E: Tensor  # (E,) float64
    points_E: Tensor  # (E,) float64


def counterpart_sums(
    s: AblationConfig, metric: Metric, model: Transformer, data: EvaluationSet, device: torch.device
) -> CounterpartSums | None:
    """The metric on the unmasked model's counterpart prompts, with each one's sums (None without them)."""
    if data.counterpart is None:
        return None
    evaluator = plain_evaluator(model, to_batches(data.counterpart, s.batch_size, device), metric)
    totals = MaskTotals.empty(1, evaluator.columns, evaluator.n_examples)
    evaluator.accumulate(torch.ones(1, *evaluator.gates_shape), totals)
    baseline = {column: float(v[0]) for column, v in totals.values().items()} | {"n_targets": int(totals.n_targets[0])}
    points_E = torch.cat([Targets.of(batch).where_BT.sum(1).cpu() for batch in evaluator.batches]).double()
    return CounterpartSums(baseline, totals.examples[0], points_E)


def counterpart_baseline(
    s: AblationConfig, metric: Metric, model: Transformer, data: EvaluationSet, device: torch.device
) -> dict[str, float] | None:
    """The metric on the unmasked model's counterpart prompts (None without them): the other end of the gap."""
    sums = counterpart_sums(s, metric, model, data, device)
    return None if sums is None else sums.baseline


def task_config(config: DictConfig) -> TaskConfig | None:
    """A run config's task section, typed; None when it names no task (the run's own data)."""
    section = OmegaConf.select(config, "task")
    if section is None or section.get("source") is None:
        return None
    return typed(section, TaskConfig)


def task_tokenizer(config: DictConfig, vocab_size: int) -> TaskTokenizer:
    """What reads a task's text for this run's model: its checkpoint's tokenizer, bytes for a byte-level model, or
    none for a model of a synthetic alphabet (token ids only)."""
    from headcount.config.data import TEXT_SOURCES
    from headcount.pretrained.run_config import checkpoint_tokenizer

    pretrained = OmegaConf.select(config, "model.pretrained")
    if pretrained:
        tokens = HFTokens(checkpoint_tokenizer(pretrained).tokenizer)
        tokens.vocab_size = min(tokens.vocab_size, vocab_size)  # ids the model has rows for
        return tokens
    source = str(config.data.source)
    if source in TEXT_SOURCES:
        return ByteTokens()
    why = f"the model reads the synthetic alphabet of data.source={source} (no tokenizer)"
    return IdsOnly(vocab_size, why, source)


def run_task(config: DictConfig, model: Transformer, cfg: TaskConfig | None = None) -> TaskSet | None:
    """The task a run's config (or `cfg`) names, encoded for its model; None for no task."""
    cfg = cfg if cfg is not None else task_config(config)
    if cfg is None:
        return None
    return build_task(cfg, task_tokenizer(config, model.cfg.vocab_size), model.cfg.n_ctx)
