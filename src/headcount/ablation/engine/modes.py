"""Ablation modes: what an ablated head's z becomes. Each mode is a component (`MODES`, named by ablation.mode) that
says how it builds its replacements, what it records about them, and whether a structural export can fold it.

- zero: nothing to compute; the gate multiplies z (z_h <- g z_h).
- mean: per layer, the head's z averaged over `n_reference` examples of the reference set and over every position
  inside them, (H, D); with `mean_per_position`, per position, (T, H, D). On a task the reference set is its prompts
  (reference_split=prompts) or their corrupted counterparts (corrupted).
- resample: example i takes z from example source[i] of the reference set, a fixed permutation drawn with
  `ablation.seed` (cycled when the evaluation set is the larger; drawing itself from the same set is skipped, since it
  would change nothing). On a task only prompts of the same token length pair up, so that position t means the same
  place in both.
- patch: example i takes z from its own counterpart: the corrupted prompt (patch_direction=noise, the clean prompt
  evaluated), or the clean prompt with the corrupted one evaluated (denoise). With task.align=last, position t takes
  the counterpart's position t + (its length - this length), and positions without one keep their own z.

resample and patch read the sources' z from one clean forward pass per evaluation batch, shared by every mask, rather
than from disk: stored, it would be L x N x T x H x D floats. Means and the resample pairing are computed once and
saved as ablation/replacements_<mode>.pt with a fingerprint of what they depend on.
"""

from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, Protocol

import torch
from torch import Tensor

from headcount.ablation.engine.seq2seq_z import grid_mean_z
from headcount.config.ablation import AblationConfig
from headcount.data.examples import to_batches
from headcount.errors import ConfigError
from headcount.io import atomic_write
from headcount.model.encoder_decoder import EncoderDecoder
from headcount.model.intervention import reads
from headcount.model.transformer import Transformer
from headcount.registry import Registry


class ReplacementStore(Protocol):
    """Where a mode keeps what it prepared (a session's results, records/results.py's ResultFiles): the file at the
    results' address, the fingerprint the saved data must match, and the list of files the session wrote."""

    key: str

    def replacements_file(self) -> Path: ...

    def note_written(self, path: Path) -> None: ...


MODES: Registry["AblationMode"] = Registry("ablation mode", "ablation.mode", "what an ablated head's z becomes")


@dataclass
class BatchReplacement:
    """One batch's replacements: per layer a tensor broadcastable to its z (B, T, H, D), or None for zero, and the
    positions a replacement applies at (B, T), None for all."""

    values: list[Tensor | None] | None
    where_BT: Tensor | None = None


@dataclass
class Replacements:
    """A session's replacements, prepared once: how every batch's are built."""

    mode: "AblationMode"
    means: list[Tensor] | None = None  # mean: one (H, D) or (T, H, D) tensor per layer

    def for_batch(self, model: Transformer, batch: dict[str, Tensor]) -> BatchReplacement:
        return self.mode.for_batch(self, model, batch)

    def constant_per_head(self) -> list[Tensor] | None:
        """A constant z per head that structural pruning can fold into the output bias (None: zero ablation)."""
        return self.mode.constant(self)


class AblationMode:
    name: ClassVar[str]
    per_example: ClassVar[bool] = False  # replacements differ per example (the memory budget counts them)
    uses_reference: ClassVar[bool] = False  # needs the reference set (mean, resample)
    pairs_examples: ClassVar[bool] = False  # each example takes another's z (L0 gates pair the reference with itself)
    needs_task: ClassVar[str | None] = None  # why the mode needs a task, when it does (a ConfigError's last part)
    own_keys: ClassVar[tuple[str, ...]] = ()  # the ablation keys this mode alone reads (refused under the others)

    def check(self, s: AblationConfig, has_corrupted: bool | None) -> None:
        """ConfigError for settings this mode cannot use; has_corrupted: whether the data has corrupted prompts (None:
        not known yet)."""

    def foldable(self, s: AblationConfig) -> bool:
        """Whether a structural export can fold the replacement into the model (a constant per head)."""
        return False

    def described(self, s: AblationConfig) -> str:
        """The mode with the settings that decide what it does, for messages: mode=mean with mean_per_position."""
        return f"mode={self.name}"

    def evaluates_corrupted(self, s: AblationConfig) -> bool:
        """Whether masks are evaluated on a task's corrupted prompts rather than its clean ones (denoising)."""
        return False

    def constant(self, prepared: Replacements) -> list[Tensor] | None:
        """The constant z per head a structural export folds into the output bias; None: zero (nothing to fold)."""
        return None

    def settings(self, s: AblationConfig) -> dict:
        """What the results record about the mode's own settings (part of their fingerprint)."""
        return {}

    def prepare(self, s: AblationConfig, model: Transformer, data, files: ReplacementStore | None) -> Replacements:
        """The session's replacements from the evaluation set `data` (adding the sources to data.examples where the
        mode reads other inputs), saved in and read back from `files` (None: in memory only)."""
        return Replacements(self)

    def for_batch(self, prepared: Replacements, model: Transformer, batch: dict[str, Tensor]) -> BatchReplacement:
        return BatchReplacement(None)


@MODES.register
class Zero(AblationMode):
    """the head's z is zeroed"""

    name = "zero"

    def foldable(self, s: AblationConfig) -> bool:
        return True


@MODES.register
class Mean(AblationMode):
    """the head's mean z over the reference set (over positions too, or per position)"""

    name, uses_reference = "mean", True
    own_keys = ("mean_per_position",)

    def described(self, s: AblationConfig) -> str:
        return "mode=mean with mean_per_position" if s.mean_per_position else "mode=mean"

    def constant(self, prepared: Replacements) -> list[Tensor] | None:
        return prepared.means

    def foldable(self, s: AblationConfig) -> bool:
        return not s.mean_per_position

    def settings(self, s: AblationConfig) -> dict:
        return {"mean_per_position": s.mean_per_position}

    def prepare(self, s: AblationConfig, model: Transformer, data, files: ReplacementStore | None) -> Replacements:
        path, device = saved_path(files), next(model.parameters()).device
        saved = load_saved(path, files.key) if path is not None else None
        if saved is None:
            batches = to_batches(data.reference, s.batch_size, device)
            saved = {"means": [m.cpu() for m in mean_z(model, batches, s.mean_per_position)]}
            save(path, files, saved)
        return Replacements(self, [m.to(device) for m in saved["means"]])

    def for_batch(self, prepared: Replacements, model: Transformer, batch: dict[str, Tensor]) -> BatchReplacement:
        T = batch["input_ids"].shape[1]
        return BatchReplacement([mean[:T] if mean.ndim == 3 else mean for mean in prepared.means])


@MODES.register
class Resample(AblationMode):
    """the head's z on another input of the reference set, paired by a seeded permutation"""

    name, per_example, uses_reference, pairs_examples = "resample", True, True, True

    def settings(self, s: AblationConfig) -> dict:
        return {"seed": s.seed}

    def prepare(self, s: AblationConfig, model: Transformer, data, files: ReplacementStore | None) -> Replacements:
        path = saved_path(files)
        saved = load_saved(path, files.key) if path is not None else None
        if saved is None:
            same_set = data.split == data.reference_split
            if data.task is None:
                n_eval, n_reference = len(data.examples["input_ids"]), len(data.reference["input_ids"])
                source = resample_sources(n_eval, n_reference, s.seed, same_set)
            else:
                source = same_length_sources(
                    data.examples["valid"].sum(1), data.reference["valid"].sum(1), s.seed, same_set
                )
            saved = {"source_index": source}
            save(path, files, saved)
        data.examples["source_ids"] = data.reference["input_ids"][saved["source_index"]]
        for column in ("src_ids", "src_mask"):  # an encoder-decoder's source pairs with its target
            if column in data.reference:
                data.examples[f"source_{column}"] = data.reference[column][saved["source_index"]]
        return Replacements(self)

    def for_batch(self, prepared: Replacements, model: Transformer, batch: dict[str, Tensor]) -> BatchReplacement:
        return source_replacement(model, batch)


@MODES.register
class Patch(AblationMode):
    """the head's z on the example's own counterpart: its corrupted prompt (noise), or the clean one (denoise)"""

    name, per_example = "patch", True
    own_keys = ("patch_direction",)
    needs_task = (
        "patches a task's corrupted prompts: name a task with counterparts (task=ioi, or task=file with a corrupted "
        "field; an encoder-decoder's: task=translation_verb)"
    )

    def evaluates_corrupted(self, s: AblationConfig) -> bool:
        return s.patch_direction == "denoise"

    def check(self, s: AblationConfig, has_corrupted: bool | None) -> None:
        if has_corrupted is False:
            raise ConfigError(
                "ablation.mode",
                "patch",
                "needs corrupted prompts, and the data has none: a task with "
                "corrupted counterparts (task.corrupted_field, or task=ioi, kv_retrieval)",
            )

    def settings(self, s: AblationConfig) -> dict:
        return {"patch_direction": s.patch_direction}

    def prepare(self, s: AblationConfig, model: Transformer, data, files: ReplacementStore | None) -> Replacements:
        task, denoise = data.task, s.patch_direction == "denoise"
        counterpart = task.examples(corrupted=not denoise)
        data.examples["source_ids"] = counterpart["input_ids"]
        for column in ("src_ids", "src_mask"):  # an encoder-decoder's: the counterpart's source feeds its encoder
            if column in counterpart:
                data.examples[f"source_{column}"] = counterpart[column]
        shift = task.shift if not denoise else -task.shift
        if bool((shift != 0).any()):
            data.examples["source_pos"] = aligned_positions(data.examples["valid"], counterpart["valid"], shift)
        return Replacements(self)

    def for_batch(self, prepared: Replacements, model: Transformer, batch: dict[str, Tensor]) -> BatchReplacement:
        return source_replacement(model, batch)


def source_replacement(model: Transformer, batch: dict[str, Tensor]) -> BatchReplacement:
    """Every layer's z on the batch's source inputs; where positions are aligned (source_pos), position t takes the
    source's position source_pos[t], and positions without one (-1) keep their own z."""
    values = clean_z(model, batch["source_ids"])
    source_pos_BT = batch.get("source_pos")
    if source_pos_BT is None:
        return BatchReplacement(values)
    index_BT = source_pos_BT.clamp_min(0)
    gathered = [z_BTHD.gather(1, index_BT[:, :, None, None].expand(-1, -1, *z_BTHD.shape[2:])) for z_BTHD in values]
    return BatchReplacement(gathered, source_pos_BT >= 0)


def aligned_positions(valid_BT: Tensor, source_valid_BT: Tensor, shift_B: Tensor) -> Tensor:
    """(B, T) the source position each position takes (t + shift), -1 outside either prompt."""
    T = valid_BT.shape[1]
    source_BT = torch.arange(T)[None] + shift_B[:, None]
    inside = valid_BT & (source_BT >= 0) & (source_BT < T)
    inside &= source_valid_BT.gather(1, source_BT.clamp(0, T - 1))
    return torch.where(inside, source_BT, -1)


def clean_z(model: Transformer, idx_BT: Tensor) -> list[Tensor]:
    """Every layer's z (B, T, H, D) on the plain model."""
    read = reads(["attn.z"], range(model.n_layers))
    model.forward_layers(model.embed(idx_BT), 0, read)
    return [read.read("attn.z", layer) for layer in range(model.n_layers)]


@torch.no_grad()
def mean_z(model: Transformer, batches: list[dict[str, Tensor]], per_position: bool) -> list[Tensor]:
    """Each layer's z averaged over the examples and, unless per_position, the positions; summed in float64. Only
    positions inside an example count (a batch's `valid`, where prompts are padded; all positions otherwise). An
    encoder-decoder's are per row of its head grid (seq2seq_z.py)."""
    if isinstance(model, EncoderDecoder):
        return grid_mean_z(model, batches, per_position)
    sums: list = [0.0] * model.n_layers
    counts_T: Tensor | float = 0.0
    for batch in batches:
        valid_BT = batch.get("valid")
        valid_BT = torch.ones_like(batch["input_ids"], dtype=torch.bool) if valid_BT is None else valid_BT
        weight_BT11 = valid_BT.double()[:, :, None, None]
        for layer, z_BTHD in enumerate(clean_z(model, batch["input_ids"])):
            sums[layer] = sums[layer] + (z_BTHD.double() * weight_BT11).sum(dim=0)
        counts_T = counts_T + valid_BT.double().sum(dim=0)
    dtype = next(model.parameters()).dtype
    if per_position:  # positions no example reaches keep a zero mean
        return [(s_THD / counts_T.clamp_min(1)[:, None, None]).to(dtype) for s_THD in sums]
    return [(s_THD.sum(dim=0) / counts_T.sum()).to(dtype) for s_THD in sums]


def resample_sources(n_eval: int, n_reference: int, seed: int, same_split: bool) -> Tensor:
    """(n_eval,) int64: the reference example whose activations replace eval example i's."""
    permutation = torch.randperm(n_reference, generator=torch.Generator().manual_seed(seed))
    source = permutation[torch.arange(n_eval) % n_reference]
    if same_split and n_reference > 1:
        itself = source == torch.arange(n_eval)
        source[itself] = (source[itself] + 1) % n_reference
    return source


def same_length_sources(lengths_N: Tensor, reference_lengths_R: Tensor, seed: int, same_set: bool) -> Tensor:
    """(N,) for each prompt a reference prompt of the same token length, drawn by a seeded permutation within each
    length (never itself when both are the same set); ConfigError for a prompt with no such partner."""
    generator = torch.Generator().manual_seed(seed)
    source = torch.full_like(lengths_N, -1)
    for length in lengths_N.unique().tolist():
        mine = (lengths_N == length).nonzero().squeeze(1)
        theirs = (reference_lengths_R == length).nonzero().squeeze(1)
        if same_set and len(theirs) > 1:  # a cyclic shift of a permutation: never itself
            order = theirs[torch.randperm(len(theirs), generator=generator)]
            source[order] = order.roll(1)
        elif len(theirs) and not same_set:
            source[mine] = theirs[torch.randint(len(theirs), (len(mine),), generator=generator)]
    if bool((source < 0).any()):
        i = int((source < 0).nonzero()[0])
        raise ConfigError(
            "ablation.mode",
            "resample",
            f"prompt {i} ({int(lengths_N[i])} tokens) has no other prompt "
            "of its length to take activations from: use more prompts, ablation.reference_split="
            "corrupted, or mode=patch",
        )
    return source


def saved_path(files: ReplacementStore | None) -> Path | None:
    return None if files is None else files.replacements_file()


def load_saved(path: Path, fingerprint: str) -> dict | None:
    """The saved replacement data if it was computed under the same fingerprint."""
    if not path.exists():
        return None
    saved = torch.load(path, map_location="cpu", weights_only=True)
    return saved if saved.get("fingerprint") == fingerprint else None


def save(path: Path | None, files: ReplacementStore | None, payload: dict) -> None:
    if path is None:
        return
    atomic_write(path, lambda f: torch.save({"fingerprint": files.key, **payload}, f), binary=True)
    files.note_written(path)
