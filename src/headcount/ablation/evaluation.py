"""A run's evaluation set under ablation settings, and the evaluator on it: what a scan session and the Python API's
`Run.evaluate` both build, the same way, so that masks evaluated either way give the same numbers."""

from dataclasses import dataclass

import torch
from torch import Tensor

from headcount.ablation.evaluator import MaskEvaluator
from headcount.ablation.replacements import Replacements, prepare_replacements
from headcount.ablation.results import ResultFiles
from headcount.config.ablation import AblationConfig
from headcount.model.transformer import Transformer
from headcount.run_dir import FinishedRun, to_batches


@dataclass
class EvaluationSet:
    examples: dict[str, Tensor]  # input_ids, loss_mask (N, T) of ablation.split; source_ids too once resample pairs
    reference: dict[str, Tensor] | None  # the reference split's examples (mean and resample), else None


def evaluation_set(run: FinishedRun, s: AblationConfig) -> EvaluationSet:
    """The first n_eval examples of s.split and, unless the mode is zero, the first n_reference of s.reference_split."""
    examples = run.examples(s.split, s.n_eval, "ablation.split")
    reference = None
    if s.mode != "zero":
        reference = run.examples(s.reference_split, s.n_reference, "ablation.reference_split")
    return EvaluationSet(examples, reference)


@dataclass
class Evaluation:
    replacements: Replacements
    batches: list[dict[str, Tensor]]  # the evaluation set in ablation.batch_size batches, on the model's device
    evaluator: MaskEvaluator


def evaluation(
    s: AblationConfig, model: Transformer, data: EvaluationSet, files: ResultFiles | None, device: torch.device
) -> Evaluation:
    """The replacements for s.mode (saved in and read back from `files`; files=None keeps them in memory), the eval
    batches and the evaluator, sized by s.masks_per_pass or s.memory_budget_mb."""
    replacements = prepare_replacements(s, data.reference, model, data.examples, files)
    batches = to_batches(data.examples, s.batch_size, device)
    budget = None if s.memory_budget_mb is None else s.memory_budget_mb * 2**20
    return Evaluation(replacements, batches, MaskEvaluator(model, batches, replacements, s.masks_per_pass, budget))
