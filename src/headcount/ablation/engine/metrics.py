"""What a mask is measured by: a metric reads the model's prediction at each score point of the evaluation set.

A score point is a position and the answer it should predict: for language modelling every target token of a split
(position t predicts input_ids[t + 1], where loss_mask marks it), for a task each prompt's scored position with its
correct answer and, optionally, a wrong one. A metric turns the prediction at each point into one or more numbers
(`columns`, the first being the metric itself); the evaluator sums them in float64 over every point of the evaluation
set and divides by the number of points, so every metric is a mean over score points (token-weighted).

Metrics are components (`METRICS`, the registry `ablation.metric` names): `loss` (next-token cross-entropy, with
accuracy beside it), `accuracy`, `logit_diff` (correct minus wrong answer logit), `answer_logprob`, `answer_prob` and
`top1`. A metric that reads only the answers' logits (`reads_vocab = False`, logit_diff) makes the evaluator unembed
two rows of the unembedding at each point instead of the whole vocabulary. A user's own metric is any callable,
named by `_target_` (see `CallableMetric`).
"""

import hashlib
import importlib
import inspect
from dataclasses import dataclass
from functools import cached_property
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from hydra.utils import get_method
from torch import Tensor

from headcount.errors import ConfigError
from headcount.model.transformer import Transformer
from headcount.registry import Registry

METRICS: Registry[type["Metric"]] = Registry("metric", "ablation.metric", "what a mask is measured by")
KEY = "ablation.metric"


@dataclass
class Targets:
    """A batch's score points: where_BT marks the positions scored (row-major order), answer_N their correct next
    token and wrong_N the wrong one (None where the data has no wrong answers)."""

    where_BT: Tensor
    answer_N: Tensor
    wrong_N: Tensor | None

    @classmethod
    def of(cls, batch: dict[str, Tensor]) -> "Targets":
        """A task batch names its points (score_mask, answer_ids, wrong_ids); a language-modelling batch scores the
        next token wherever loss_mask marks it: position t predicts input_ids[t + 1] if loss_mask[t + 1]."""
        if "score_mask" in batch:
            where_BT = batch["score_mask"]
            wrong = batch.get("wrong_ids")
            return cls(where_BT, batch["answer_ids"][where_BT], None if wrong is None else wrong[where_BT])
        ids_BT = batch["input_ids"]
        where_BT = torch.zeros_like(ids_BT, dtype=torch.bool)
        where_BT[:, :-1] = batch["loss_mask"][:, 1:].bool()
        return cls(where_BT, ids_BT[:, 1:][where_BT[:, :-1]], None)

    def __len__(self) -> int:
        return len(self.answer_N)


class Readout:
    """The model's prediction at N score points: the final stream normalised, and the logits a metric asks for (all
    of them, or only the answers' rows of the unembedding)."""

    def __init__(self, model: Transformer, final_NC: Tensor, answer_N: Tensor, wrong_N: Tensor | None):
        self.model, self.answer_N, self.wrong_N = model, answer_N, wrong_N
        self.normed_NC = model.readout(model.ln_f(final_NC))  # the unembedding's input (scaled: T5 v1.0)

    @cached_property
    def logits_NV(self) -> Tensor:
        logits = self.model.lm_head(self.normed_NC)
        return logits.float() if logits.dtype in (torch.float16, torch.bfloat16) else logits

    def logit_of(self, ids_N: Tensor) -> Tensor:
        """(N,) the logit of token ids_N[n] at point n, from one unembedding row per point unless the logits exist,
        soft-capped as the unembedding caps every logit (Gemma 2's final soft-cap)."""
        if "logits_NV" in self.__dict__:
            return self.logits_NV.gather(1, ids_N[:, None])[:, 0]
        normed_NC, rows_NC = self.normed_NC, self.model.lm_head.weight[ids_N]
        if normed_NC.dtype in (torch.float16, torch.bfloat16):  # the dot product in float32, as the logits above
            normed_NC, rows_NC = normed_NC.float(), rows_NC.float()
        logit_N = (normed_NC * rows_NC).sum(-1)
        if self.model.lm_head.bias is not None:  # a bias per token (model.logits_bias)
            logit_N = logit_N + self.model.lm_head.bias[ids_N].to(logit_N.dtype)
        cap = self.model.lm_head.softcap
        return logit_N if cap is None else torch.tanh(logit_N / cap) * cap


class Metric:
    """A metric's contract: `values(readout)` gives (N, K) per-point values for its K `columns`."""

    name: ClassVar[str]
    columns: ClassVar[tuple[str, ...]]  # the metric first, then values that come at no extra cost
    higher_is_better: ClassVar[bool]
    unit: ClassVar[str]  # what the metric's number is, for axis labels
    needs_wrong: ClassVar[bool] = False  # reads a wrong answer per point
    reads_vocab: ClassVar[bool] = True  # needs the whole vocabulary's logits (a softmax, an argmax)
    differentiable: ClassVar[bool] = True  # gradients (importance, attribution, L0 gates) can follow it
    # Whether results name the metric (titles, labels, the settings they record); loss, the one metric results had
    # before the others, goes unnamed so that its results read as they always did.
    named_in_results: ClassVar[bool] = True

    def values(self, readout: Readout) -> Tensor:
        raise NotImplementedError

    @property
    def primary(self) -> str:
        return self.columns[0]

    def damage(self, value: Any, baseline: Any) -> Any:
        """How much worse value is than baseline, in the metric's unit (positive: worse)."""
        return baseline - value if self.higher_is_better else value - baseline

    def badness(self, value: Tensor) -> Tensor:
        """What an optimiser minimises to keep the metric good: the metric, or its negative."""
        return -value if self.higher_is_better else value

    def describe(self) -> dict:
        return {"name": self.name, "higher_is_better": self.higher_is_better}


@METRICS.register
class Loss(Metric):
    """next-token cross-entropy of the answer (nats), with top-1 accuracy beside it"""

    name, columns, higher_is_better, unit = "loss", ("loss", "acc"), False, "nats"
    named_in_results = False

    def values(self, readout: Readout) -> Tensor:
        logits_NV = readout.logits_NV
        nll_N = F.cross_entropy(logits_NV, readout.answer_N, reduction="none")
        hit_N = (logits_NV.argmax(dim=-1) == readout.answer_N).to(nll_N.dtype)
        return torch.stack([nll_N, hit_N], dim=1)


@METRICS.register
class Accuracy(Loss):
    """share of points whose top prediction is the answer (token-weighted), with the loss beside it"""

    name, columns, higher_is_better, unit, differentiable = "accuracy", ("acc", "loss"), True, "fraction", False

    def values(self, readout: Readout) -> Tensor:
        return super().values(readout).flip(1)


@METRICS.register
class LogitDiff(Metric):
    """logit of the correct answer minus the logit of the wrong one"""

    name, columns, higher_is_better, unit = "logit_diff", ("logit_diff",), True, "logits"
    needs_wrong, reads_vocab = True, False

    def values(self, readout: Readout) -> Tensor:
        return (readout.logit_of(readout.answer_N) - readout.logit_of(readout.wrong_N))[:, None]


@METRICS.register
class AnswerLogprob(Metric):
    """log-probability of the correct answer (nats)"""

    name, columns, higher_is_better, unit = "answer_logprob", ("answer_logprob",), True, "log-probability (nats)"

    def values(self, readout: Readout) -> Tensor:
        return -F.cross_entropy(readout.logits_NV, readout.answer_N, reduction="none")[:, None]


@METRICS.register
class AnswerProb(Metric):
    """probability of the correct answer"""

    name, columns, higher_is_better, unit = "answer_prob", ("answer_prob",), True, "probability"

    def values(self, readout: Readout) -> Tensor:
        return (-F.cross_entropy(readout.logits_NV, readout.answer_N, reduction="none")).exp()[:, None]


@METRICS.register
class Top1(Metric):
    """share of prompts whose top prediction is the correct answer"""

    name, columns, higher_is_better, unit, differentiable = "top1", ("top1",), True, "fraction", False

    def values(self, readout: Readout) -> Tensor:
        return (readout.logits_NV.argmax(dim=-1) == readout.answer_N).to(readout.logits_NV.dtype)[:, None]


class CallableMetric(Metric):
    """A user's metric: `fn(logits, answer_ids, wrong_ids) -> values`, with logits (N, V) at the N score points (float),
    answer_ids (N,) int64, wrong_ids (N,) int64 or None when the data has no wrong answers, and values (N,) float, one
    per point; the reported number is their mean. Gradient-based scans need it differentiable in the logits."""

    unit = "metric value"

    def __init__(self, fn: Any, name: str, higher_is_better: bool, needs_wrong: bool):
        self.fn, self.name, self.columns = fn, name, (name,)
        self.higher_is_better, self.needs_wrong = higher_is_better, needs_wrong

    def values(self, readout: Readout) -> Tensor:
        try:
            values = self.fn(readout.logits_NV, readout.answer_N, readout.wrong_N)
        except Exception as error:  # the user's code: whatever it raises becomes one line naming it
            hint = ""
            if readout.wrong_N is None:
                hint = " (wrong_ids is None: the task has no wrong answers; needs_wrong: true refuses such tasks)"
            cause = str(error).strip().split("\n")[0]
            raise ConfigError(f"{KEY}._target_", self.target, f"raised {type(error).__name__}: {cause}{hint}") from None
        if not isinstance(values, Tensor) or values.shape != readout.answer_N.shape:
            got = tuple(values.shape) if isinstance(values, Tensor) else type(values).__name__
            raise ConfigError(
                f"{KEY}._target_",
                self.target,
                f"must return one value per score point, shape ({len(readout.answer_N)},); it returned {got}",
            )
        if not bool(torch.isfinite(values).all()):
            bad = int((~torch.isfinite(values)).sum())
            raise ConfigError(
                f"{KEY}._target_",
                self.target,
                f"returned {bad} NaN or infinite value(s) of {len(values)} score points: nothing was written",
            )
        return values.to(readout.normed_NC.dtype)[:, None]

    @property
    def target(self) -> str:
        return f"{self.fn.__module__}.{self.fn.__qualname__}"

    def describe(self) -> dict:
        """With the function's code: a body edited in place (the same _target_) changes the session's fingerprint,
        so its results are computed again rather than read back as up to date."""
        return {**super().describe(), "_target_": self.target, "code": code_fingerprint(self.fn)}


def code_fingerprint(fn: Any) -> str:
    """A hash of a function's source (of its bytecode and constants where the source cannot be read)."""
    try:
        code = inspect.getsource(fn)
    except (OSError, TypeError):
        inner = getattr(fn, "__code__", None)
        code = repr(type(fn)) if inner is None else repr((inner.co_code, inner.co_consts, inner.co_names))
    return hashlib.sha256(code.encode()).hexdigest()[:16]


class NamedMetric(Metric):
    """A metric known by name only (a user's, read back from a table): its value column is its name."""

    unit = "metric value"

    def __init__(self, name: str, higher_is_better: bool = True):
        self.name, self.columns, self.higher_is_better = name, (name,), higher_is_better


def metric_named(name: str | None, higher_is_better: bool = True) -> Metric:
    """The metric a result names (its `metric` column, a summary section): a built-in, or a user's by name."""
    name = name or "loss"
    return METRICS[name]() if name in METRICS else NamedMetric(name, higher_is_better)


def table_metric(table: Any) -> Metric:
    """The metric a result table was computed with (tables from before metrics existed: loss)."""
    named = "metric" in table and len(table) and str(table["metric"].iloc[0])
    return metric_named(named or "loss")


CALLABLE_KEYS = {"_target_", "name", "higher_is_better", "needs_wrong"}
# The columns result tables have beside a metric's (a user's metric named `mode` overwrote the mode column), and the
# prefixes of the columns derived from a metric's (delta_<metric>, baseline_<metric> in summary.json).
TABLE_COLUMNS = frozenset(
    [
        "mask",
        "layer",
        "head",
        "position",
        "mode",
        "metric",
        "task",
        "split",
        "n_eval",
        "n_targets",
        "reference_split",
        "n_reference",
        "n_heads_off",
        "gap_fraction",
        "acc",
        "loss",
        "patch_direction",
        "attribution",
        "exact",
        "verified",
        "rank",
        "direct_effect",
        "direct_effect_after",
        "grad_importance",
        "grad_importance_raw",
        "retrieval_score",
        "induction_score",
        "prev_token_score",
        "n_heads",
        "kept",
    ]
)
DERIVED_PREFIXES = ("delta_", "baseline_")


def resolve_metric(spec: Any, has_wrong: bool | None = None, task: bool = False) -> Metric:
    """The metric `ablation.metric` names: a registered name, a mapping with `_target_` (a user's callable), or None
    for the default (loss on language-modelling data; on a task, logit_diff when it has wrong answers, else
    answer_logprob). has_wrong: whether the data has wrong answers (None: not known yet, not checked)."""
    if spec is None:
        spec = "loss" if not task else "logit_diff" if has_wrong else "answer_logprob"
    metric = callable_metric(spec) if isinstance(spec, dict) or hasattr(spec, "keys") else METRICS.get(str(spec))()
    if metric.needs_wrong and has_wrong is False:
        raise ConfigError(
            KEY,
            metric.name,
            "needs a wrong answer per prompt, and the task has none (task fields: wrong); allowed without one: "
            + ", ".join(name for name in METRICS if not METRICS[name].needs_wrong),
        )
    return metric


def callable_metric(spec: Any) -> CallableMetric:
    spec = dict(spec)
    unknown = set(spec) - CALLABLE_KEYS
    if unknown or "_target_" not in spec:
        problem = f"unknown keys: {', '.join(sorted(unknown))}" if unknown else "no _target_"
        form = "{_target_: module.function, name: ..., higher_is_better: true|false, needs_wrong: true|false}"
        raise ConfigError(KEY, spec, f"a metric name or {form}; {problem}")
    target = str(spec["_target_"])
    try:
        fn = get_method(target)
    except Exception:  # Hydra wraps import and attribute errors alike, and words some of them wrong
        raise ConfigError(
            f"{KEY}._target_", target, f"does not import as a function ({import_problem(target)})"
        ) from None
    name = str(spec.get("name") or fn.__name__)
    if name in METRICS:
        raise ConfigError(f"{KEY}.name", name, "is a built-in metric's name: name your own metric otherwise")
    if not name.isidentifier() or name in TABLE_COLUMNS or name.startswith(DERIVED_PREFIXES):
        raise ConfigError(
            f"{KEY}.name",
            name,
            "names a table column and file names: a plain identifier (letters, digits, _), not one of the tables' "
            f"own columns ({', '.join(sorted(TABLE_COLUMNS))}) nor starting with {' or '.join(DERIVED_PREFIXES)}",
        )
    return CallableMetric(fn, name, bool(spec.get("higher_is_better", True)), bool(spec.get("needs_wrong", False)))


def import_problem(target: str) -> str:
    """Why `module.attribute` does not import, said right: Hydra's locate reports a missing attribute of a module that
    imports as a missing module ("No module named 'os.path.nope'; 'os.path' is not a package")."""
    parts = target.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        module_name = ".".join(parts[:cut])
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as error:
            if error.name is not None and not module_name.startswith(error.name) and error.name != module_name:
                return f"importing {module_name} failed: no module named {error.name}"
            continue
        except Exception as error:  # the user's module raised while importing
            return f"importing {module_name} failed: {type(error).__name__}: {error}"
        owner = module
        for name in parts[cut:]:
            if not hasattr(owner, name):
                return f"module {module_name} has no attribute {'.'.join(parts[cut:])}"
            owner = getattr(owner, name)
        return f"{target} is not a function"
    return f"no module named {parts[0]}"


@torch.no_grad()
def batch_sums(model: Transformer, final_XTC: Tensor, targets: Targets, metric: Metric, copies: int = 1) -> Tensor:
    """(copies, K) float64: each metric column summed over a batch's score points, for `copies` stacked copies of the
    batch in the final stream (copies * B, T, C), mask-major, as the evaluator batches masks."""
    return point_values(model, final_XTC, targets, metric, copies).double().sum(dim=1)


def point_values(model: Transformer, final_XTC: Tensor, targets: Targets, metric: Metric, copies: int = 1) -> Tensor:
    """(copies, N, K) the metric's values at each score point of each copy (differentiable where the metric is)."""
    B = targets.where_BT.shape[0]
    final_PNC = final_XTC.view(copies, B, *final_XTC.shape[1:])[:, targets.where_BT]
    N = final_PNC.shape[1]
    wrong = None if targets.wrong_N is None else targets.wrong_N.repeat(copies)
    readout = Readout(model, final_PNC.reshape(copies * N, final_XTC.shape[-1]), targets.answer_N.repeat(copies), wrong)
    values = metric.values(readout)
    return values.view(copies, N, values.shape[-1])


def require_differentiable(spec: Any, what: str) -> None:
    """ConfigError naming ablation.metric when the metric has no useful gradient (an argmax) and `what` needs one."""
    metric = resolve_metric(spec) if spec is not None else None
    with_gradient = [name for name in METRICS if METRICS[name].differentiable]
    if metric is not None and not metric.differentiable:
        raise ConfigError(
            KEY,
            metric.name,
            f"{what} follows the metric's gradient, and {metric.name} has none (an argmax): use "
            + " or ".join(", ".join(with_gradient).rsplit(", ", 1)),
        )
