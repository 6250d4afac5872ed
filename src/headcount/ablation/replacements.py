"""What an ablated head's z becomes: zero, the head's mean over a reference set, or its value on another input.

- zero: nothing to compute; the gate multiplies z.
- mean: per layer, the head's z averaged over `n_reference` examples of `reference_split` and over every position,
  (H, D); with `mean_per_position`, per position, (T, H, D). Every position counts whatever loss_mask says, since a
  head runs at every position.
- resample: example i of the eval set takes z from example source[i] of the reference split, where source is a fixed
  permutation of the reference examples drawn with `ablation.seed` (cycled when the eval set is the larger; when both
  are the same split, an example that drew itself takes the next one instead, since resampling a head with its own
  activation would change nothing). The sources' z comes from one clean forward pass per eval batch, shared by every
  mask, rather than from disk: stored, it would be L x N x T x H x D floats.

The means and the pairing are saved as ablation/replacements_<mode>.pt with a fingerprint of everything they depend
on, and reused while the fingerprint matches (`prepare_replacements`).
"""

from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from headcount.ablation.results import ResultFiles
from headcount.config.ablation import AblationConfig
from headcount.model.transformer import Transformer
from headcount.run_dir import to_batches


@dataclass
class Replacements:
    mode: str  # zero | mean | resample
    means: list[Tensor] | None = None  # mean: one (H, D) or (T, H, D) tensor per layer

    def for_batch(self, model: Transformer, batch: dict[str, Tensor]) -> list[Tensor | None] | None:
        """One replacement per layer, broadcastable to the batch's z (B, T, H, D); None means zero ablation.
        Resample reads the paired reference examples from batch["source_ids"]."""
        if self.mode == "zero":
            return None
        if self.mode == "mean":
            T = batch["input_ids"].shape[1]
            return [mean[:T] if mean.ndim == 3 else mean for mean in self.means]
        return clean_z(model, batch["source_ids"])


def prepare_replacements(
    s: AblationConfig,
    reference: dict[str, Tensor] | None,
    model: Transformer,
    examples: dict[str, Tensor],
    files: ResultFiles | None,
) -> Replacements:
    """The session's replacements: the means of the `reference` examples or the resample pairing with them, from
    ablation/replacements_<mode>.pt when they were computed under the same fingerprint (files.key); with files=None
    computed in memory and saved nowhere (the Python API's evaluate). For resample, adds each eval example's source
    tokens to `examples` as source_ids."""
    if s.mode == "zero":
        return Replacements("zero")
    path = None if files is None else files.out / f"replacements_{s.mode}.pt"
    saved = None if path is None else load_saved(path, files.key)
    device = next(model.parameters()).device
    if s.mode == "mean":
        if saved is None:
            batches = to_batches(reference, s.batch_size, device)
            saved = {"means": [m.cpu() for m in mean_z(model, batches, s.mean_per_position)]}
            if files is not None:
                save(path, files.key, saved)
                files.note_written(path)
        return Replacements("mean", [m.to(device) for m in saved["means"]])
    if saved is None:
        same_split = s.split == s.reference_split
        n_eval, n_reference = len(examples["input_ids"]), len(reference["input_ids"])
        saved = {"source_index": resample_sources(n_eval, n_reference, s.seed, same_split)}
        if files is not None:
            save(path, files.key, saved)
            files.note_written(path)
    examples["source_ids"] = reference["input_ids"][saved["source_index"]]
    return Replacements("resample")


def clean_z(model: Transformer, idx_BT: Tensor) -> list[Tensor]:
    """Every layer's z (B, T, H, D) on the plain model."""
    cache: dict = {}
    model.forward_layers(model.embed(idx_BT), 0, cache=cache)
    return [cache["z", layer] for layer in range(model.n_layers)]


@torch.no_grad()
def mean_z(model: Transformer, batches: list[dict[str, Tensor]], per_position: bool) -> list[Tensor]:
    """Each layer's z averaged over the examples and, unless per_position, the positions; summed in float64."""
    sums = [0.0] * model.n_layers
    n_examples = 0
    for batch in batches:
        for layer, z_BTHD in enumerate(clean_z(model, batch["input_ids"])):
            sums[layer] = sums[layer] + z_BTHD.double().sum(dim=0)
        n_examples += batch["input_ids"].shape[0]
    dtype = next(model.parameters()).dtype
    means = [(s / n_examples).to(dtype) for s in sums]
    return means if per_position else [m_THD.mean(dim=0) for m_THD in means]


def resample_sources(n_eval: int, n_reference: int, seed: int, same_split: bool) -> Tensor:
    """(n_eval,) int64: the reference example whose activations replace eval example i's."""
    permutation = torch.randperm(n_reference, generator=torch.Generator().manual_seed(seed))
    source = permutation[torch.arange(n_eval) % n_reference]
    if same_split and n_reference > 1:
        itself = source == torch.arange(n_eval)
        source[itself] = (source[itself] + 1) % n_reference
    return source


def load_saved(path: Path, fingerprint: str) -> dict | None:
    """The saved replacement data if it was computed under the same fingerprint."""
    if not path.exists():
        return None
    saved = torch.load(path, map_location="cpu", weights_only=True)
    return saved if saved.get("fingerprint") == fingerprint else None


def save(path: Path, fingerprint: str, payload: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    torch.save({"fingerprint": fingerprint, **payload}, tmp)
    tmp.replace(path)
