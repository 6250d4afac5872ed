"""The fast evaluator: the exact metric of many head masks on one evaluation set.

Every scan, the pruning curves and the baseline run through `MaskEvaluator`. Each mask's result equals one plain
forward pass per mask, `model(x, gated(mask, r))` (head gates at the attn.z sites, model/intervention.py), read by
the metric at the evaluation set's score points (ablation/engine/metrics.py), up to float rounding. Three kinds of
reuse make it cheaper, all exact:

- Prefix caching: one clean forward pass per eval batch caches the residual stream before every layer. A mask whose
  first touched layer is f runs only layers f..L-1 from the cached stream; a mask that touches nothing costs nothing.
- Clean attention at layer f: gates act on z, after attention, and layer f's input is the clean one, so its z is the
  clean pass's z. A pass gates that z and finishes layer f from it (`Block.finish`, the code path Block.forward
  takes after attention: output projection and MLP), skipping its qkv projection and attention.
- Unchanged positions: positions before the first one a mask can change, and after the last one scored, cannot
  change a score point. In patch (and resample) mode a head's replacement is its z on the source prompt, equal to
  the clean z up to the first token where the two prompts differ (p_b; IOI: S2), so a pass runs only positions
  [p_b, e_b) of each example (e_b: one past its last score point), left-aligned, over the clean keys and values
  before p_b (model/suffix.py); the positions it skips keep the clean stream. With zero or mean ablation on a task,
  p_b is 0 and only the positions after the last score point are skipped. Used when it runs at most 3/4 of the
  positions (`skip_unchanged`). The last layer's output is read at the score points only, so it runs its queries,
  output projection and MLP from each example's first score point on (the keys and values of every run position
  still count).
- Batched masks: P masks that share f run as one pass over the batch repeated P times (mask-major, row p*B + b) with
  per-example gates (P*B, L, H). P is `masks_per_pass`, or as many as fit the memory budget; when not even one mask
  of a whole batch fits, batches are split instead. On CPU the default budget is small on purpose: passes of one or
  two thousand tokens stay in cache and run ~20-30% faster per token than passes of eight thousand (bench_scan.py).
  It is never smaller than the model's weights, though: every pass reads the weights of its layers and of the
  unembedding, and a pretrained model's (SmolLM2-135M: 540 MB) would otherwise be run one mask of one example at a
  time, ~2.5x slower per token on 2 CPU cores.

The unembedding runs only at the score points, and only as far as the metric reads it (two rows per point for a
logit difference, not the vocabulary). A mask may name a position (a task's named position, `position` of the
masks): its heads are then replaced at that position only. Batches are the outer loop, so the clean pass is computed
once per batch for all masks, and `MaskTotals` (per-mask sums over the batches done) is all an interrupted scan needs
to resume. One batch for a set of masks (`accumulate_batch`) is also the step a distributed scan's processes take,
each for its share of the masks (ablation/records/distributed.py).

The module runs about 300 lines on purpose: the three reuses and the memory sizing that decides how many masks
share a pass are one algorithm, and its exactness argument is easiest to check when it reads in one place.
"""

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
from torch import Tensor

from headcount.ablation.engine.heads import existing_heads
from headcount.ablation.engine.metrics import Loss, Metric, Targets, point_values
from headcount.ablation.engine.modes import BatchReplacement, Replacements, Zero
from headcount.model.intervention import Gates, Intervention, reads
from headcount.model.memory import default_memory_budget
from headcount.model.sites import Site
from headcount.model.suffix import SuffixLayout, clean_keys_values, suffix_block
from headcount.model.transformer import Transformer


@dataclass
class MaskTotals:
    """Per-mask sums over the eval batches done so far: each metric column summed over score points, and the points."""

    batches_done: Tensor  # (M,) int64: mask m has seen batches 0..batches_done[m]-1
    sums: Tensor  # (M, K) float64, one column per metric column
    n_targets: Tensor  # (M,) int64: score points summed over
    columns: tuple[str, ...]
    # (M, examples) float64: each example's primary column summed over its points, the bootstrap's units; None when
    # not kept (a scan resumed from a partial file, which holds sums only)
    examples: Tensor | None = None

    @classmethod
    def empty(cls, n_masks: int, columns: tuple[str, ...], n_examples: int | None = None) -> "MaskTotals":
        zeros = torch.zeros(n_masks, dtype=torch.int64)
        sums = torch.zeros(n_masks, len(columns), dtype=torch.float64)
        examples = None if n_examples is None else torch.zeros(n_masks, n_examples, dtype=torch.float64)
        return cls(zeros, sums, zeros.clone(), tuple(columns), examples)

    def add(self, index: Tensor, sums_PK: Tensor, n_targets: int, example_PB: Tensor | None = None, at=None) -> None:
        """Add one batch's sums for the masks `index`; example_PB, the batch's examples' own sums (at: their
        columns of `examples`), where examples are kept."""
        self.batches_done[index] += 1
        self.sums[index] += sums_PK.cpu()
        self.n_targets[index] += n_targets
        if self.examples is not None and example_PB is not None:
            self.examples[index, at] += example_PB.cpu()

    def value(self, column: str) -> Tensor:
        """(M,) float64: the column's mean over the score points."""
        return self.sums[:, self.columns.index(column)] / self.n_targets

    def values(self) -> dict[str, Tensor]:
        return {column: self.value(column) for column in self.columns}


@dataclass
class CleanPass:
    """One eval batch through the plain model: what every mask's pass on that batch starts from."""

    resid_pre: list[Tensor]  # L + 1 entries (B, T, C): the stream before each layer, then the final stream
    z: list[Tensor]  # L entries (B, T, H, D)
    replacement: BatchReplacement
    targets: Targets
    named_pos: Tensor | None  # (B, K) the task's named positions, for masks that name one
    sums: Tensor  # (1, K) float64
    example_sums: Tensor  # (1, B) float64: each example's primary column summed over its points
    layout: SuffixLayout | None = None  # the positions masked passes run, None: all
    clean_kv: list[tuple[Tensor, Tensor]] | None = None  # per layer the clean keys and values (B, G, T, D)


@dataclass
class MaskSet:
    """Masks ready for the evaluator: gates on its device, the first layer each touches, the position each names."""

    gates_MLH: Tensor
    start_M: Tensor  # (M,) on CPU
    position_M: Tensor  # (M,) on CPU, -1: every position

    def __len__(self) -> int:
        return len(self.gates_MLH)

    def subset(self, index: Tensor) -> "MaskSet":
        return MaskSet(self.gates_MLH[index.to(self.gates_MLH.device)], self.start_M[index], self.position_M[index])


class MaskEvaluator:
    def __init__(
        self,
        model: Transformer,
        batches: list[dict[str, Tensor]],
        replacements: Replacements | None = None,
        masks_per_pass: int | None = None,
        memory_budget: int | None = None,
        prefix_cache: bool = True,
        clean_attention: bool = True,
        metric: Metric | None = None,
        skip_unchanged: bool = True,
    ):
        """batches: dicts of input_ids (B, T) and either loss_mask (language modelling) or score_mask, answer_ids and
        wrong_ids (a task), plus source_ids for resample and patch, on the model's device, all of one size but the
        last. masks_per_pass: P, keeping the batches as they are; None sizes passes (and if need be batches) to
        memory_budget, bytes of activations per pass (default: 64 MiB on CPU, half the free CUDA memory).
        prefix_cache, clean_attention and skip_unchanged switch the reuse off, for tests and benchmarks. metric:
        default loss."""
        self.model = model.eval()
        self.replacements = replacements or Replacements(Zero())
        self.metric = metric or Loss()
        self.prefix_cache = prefix_cache
        self.clean_attention = clean_attention
        self.skip_unchanged = skip_unchanged
        param = next(model.parameters())
        self.device, self.dtype = param.device, param.dtype
        B, T = batches[0]["input_ids"].shape
        if masks_per_pass is None:
            budget = memory_budget or default_memory_budget(model)
            per_example = self.replacements.mode.per_example
            points = max(int(Targets.of(batch).where_BT.sum(1).max()) for batch in batches)
            logits = points * (model.cfg.vocab_size if self.metric.reads_vocab else 2)
            clean = clean_bytes_per_example(model, T, per_example)
            runs = [self.layout(batch) for batch in batches]
            S = max(T if layout is None else layout.S for layout in runs)
            per_mask = mask_bytes_per_example(model, S, per_example, logits, keys=T + S if S < T else T)
            B = max(1, min(B, budget // (clean + per_mask)))
            masks_per_pass = max(1, (budget - B * clean) // (B * per_mask))
        self.masks_per_pass = masks_per_pass
        self.batch_size = B  # examples per pass and per resume step
        self.batches = [
            {key: v[i : i + B] for key, v in batch.items()}
            for batch in batches
            for i in range(0, len(batch["input_ids"]), B)
        ]
        sizes = [len(batch["input_ids"]) for batch in self.batches]
        self.example_starts = [0, *torch.tensor(sizes).cumsum(0).tolist()]  # batch b holds examples starts[b]..[b+1]
        hpl = model.heads_per_layer
        self.exists_LH = existing_heads(hpl, model.max_heads, self.device)

    @property
    def gates_shape(self) -> tuple[int, int]:
        return self.model.n_layers, self.model.max_heads

    @property
    def n_examples(self) -> int:
        return self.example_starts[-1]

    def layers_run(self, start: int) -> int:
        """What a pass of masks starting at layer `start` costs, in layers: those it runs, and the clean pass's share
        (a scan over several processes shares its passes out by it)."""
        return self.model.n_layers - start + 1

    @property
    def columns(self) -> tuple[str, ...]:
        return self.metric.columns

    def baseline(self) -> dict[str, float]:
        """The unmasked model: each metric column, and n_targets (the score points)."""
        totals = self.accumulate(torch.ones(1, *self.gates_shape))
        return {column: float(v[0]) for column, v in totals.values().items()} | {"n_targets": int(totals.n_targets[0])}

    def evaluate(self, gates_MLH: Tensor, on_pass: Callable[[MaskTotals, int], None] | None = None) -> dict:
        """Each metric column (M,) float64 for gates (M, L, H): the callable pruning_curves takes."""
        return self.accumulate(gates_MLH, on_pass=on_pass).values()

    def accumulate(
        self,
        gates_MLH: Tensor,
        totals: MaskTotals | None = None,
        on_pass: Callable[[MaskTotals, int], None] | None = None,
        position_M: Tensor | None = None,
    ) -> MaskTotals:
        """Add to `totals` (fresh by default) every eval batch each mask has not seen, in batch order.
        position_M: (M,) the column of each batch's named_pos a mask replaces its heads at (-1: every position).
        on_pass(totals, n_masks) runs after every pass: progress bars and partial saves hook in there."""
        masks = self.mask_set(gates_MLH, position_M)
        totals = totals if totals is not None else MaskTotals.empty(len(gates_MLH), self.columns)
        for b in range(len(self.batches)):
            self.accumulate_batch(b, masks, totals, on_pass)
        return totals

    def mask_set(self, gates_MLH: Tensor, position_M: Tensor | None = None) -> MaskSet:
        gates_MLH = gates_MLH.to(self.device, self.dtype)
        position_M = torch.full((len(gates_MLH),), -1) if position_M is None else position_M.cpu()
        return MaskSet(gates_MLH, self.start_layers(gates_MLH), position_M)

    @torch.no_grad()
    def accumulate_batch(
        self,
        b: int,
        masks: MaskSet,
        totals: MaskTotals,
        on_pass: Callable[[MaskTotals, int], None] | None = None,
    ) -> None:
        """Eval batch b for every mask that has seen batches 0..b-1 and not b: one clean pass, then the masked
        passes (a distributed scan's processes each run this for their share of the masks,
        ablation/records/distributed.py)."""
        todo = (totals.batches_done == b).nonzero().squeeze(1)
        if not len(todo):
            return
        clean = self.clean_pass(self.batches[b])
        at = slice(self.example_starts[b], self.example_starts[b + 1])
        for start, index in self.passes(todo, masks.start_M):
            sums = self.masked_pass(clean, masks.gates_MLH[index.to(self.device)], start, masks.position_M[index])
            totals.add(index, sums[0], len(clean.targets), sums[1], at)
            if on_pass is not None:
                on_pass(totals, len(index))

    def touched(self, gates_MLH: Tensor) -> Tensor:
        """(M, L) bool: which layers a mask changes (a gate other than 1 on a head the layer has)."""
        return ((gates_MLH != 1) & self.exists_LH).any(dim=-1)

    def start_layers(self, gates_MLH: Tensor) -> Tensor:
        """(M,) on CPU: the first layer each mask touches, L for none; 0 for all without prefix caching."""
        touched_ML = self.touched(gates_MLH).cpu()
        L = touched_ML.shape[1]
        first_M = torch.where(touched_ML.any(1), touched_ML.int().argmax(1), L)
        return first_M if self.prefix_cache else torch.zeros_like(first_M)

    def passes(self, todo: Tensor, start_M: Tensor) -> Iterator[tuple[int, Tensor]]:
        """(start layer, mask indices) per pass: masks grouped by start layer, masks_per_pass at most."""
        starts = start_M[todo]
        for start in starts.unique().tolist():
            yield from ((start, index) for index in todo[starts == start].split(self.masks_per_pass))

    def layout(self, batch: dict[str, Tensor]) -> SuffixLayout | None:
        """The positions a masked pass of this batch runs (module docstring), None: all of them, when skipping would
        save less than a quarter of the positions."""
        if not self.skip_unchanged or not self.model.cfg.causal:  # an encoder's every position reads every other
            return None
        ids_BT = batch["input_ids"]
        B, T = ids_BT.shape
        arange_T = torch.arange(T, device=ids_BT.device)
        start_B = torch.zeros(B, dtype=torch.int64, device=ids_BT.device)
        if self.replacements.mode.per_example and "source_ids" in batch and "source_pos" not in batch:
            differs_BT = ids_BT != batch["source_ids"]
            start_B = torch.where(differs_BT.any(1), differs_BT.int().argmax(1), T)
        scored_BT = Targets.of(batch).where_BT
        end_B = torch.where(scored_BT, arange_T + 1, 0).amax(1)
        # A score point before p_b keeps its clean value; an example scored nowhere after p_b runs nothing.
        layout = SuffixLayout(start_B, torch.maximum(start_B, end_B), T)
        return layout if layout.S * 4 <= T * 3 else None

    def clean_pass(self, batch: dict[str, Tensor]) -> CleanPass:
        model = self.model
        L = model.n_layers
        read = reads(["resid_pre", "attn.z"], range(L))
        final_BTC = model.forward_layers(model.embed(batch["input_ids"]), 0, read)
        targets = Targets.of(batch)
        layout = self.layout(batch)
        resid_pre = [read.read("resid_pre", layer) for layer in range(L)]
        return CleanPass(
            resid_pre=resid_pre + [final_BTC],
            z=[read.read("attn.z", layer) for layer in range(L)],
            replacement=self.replacements.for_batch(model, batch),
            targets=targets,
            named_pos=batch.get("named_pos"),
            **dict(zip(("sums", "example_sums"), pass_sums(model, final_BTC, targets, self.metric))),
            layout=layout,
            clean_kv=None if layout is None else [clean_keys_values(b, r) for b, r in zip(model.blocks, resid_pre)],
        )

    def masked_pass(self, clean: CleanPass, gates_PLH: Tensor, start: int, position_P: Tensor) -> tuple[Tensor, Tensor]:
        """(P, K) metric sums for P masks whose first touched layer is `start` (or later), and (P, B) each example's
        primary column summed over its points."""
        P, L = len(gates_PLH), self.model.n_layers
        if start == L:
            return clean.sums.expand(P, -1), clean.example_sums.expand(P, -1)
        B, T, C = clean.resid_pre[0].shape
        gates_XLH = gates_PLH.repeat_interleave(B, dim=0)
        touched_L = self.touched(gates_PLH).any(dim=0)
        replacements = repeated_replacements(clean.replacement.values, touched_L, P)
        where_XT = self.gate_positions(clean, position_P)
        if clean.layout is not None:
            return self.suffix_pass(clean, gates_XLH, start, touched_L, replacements, where_XT, P)
        resid_XTC = clean.resid_pre[start].repeat(P, 1, 1)
        gates = Gates(gates_XLH, replacements, where_XT)
        if self.clean_attention:
            z_XTHD = gates(clean.z[start].repeat(P, 1, 1, 1), Site("attn.z", start))
            resid_XTC = self.model.blocks[start].finish(resid_XTC, z_XTHD)
            start += 1
        # Every later gate 1: the plain layers give the same numbers without the gating arithmetic.
        intervention = Intervention(gates.hooks(start)) if touched_L[start:].any() else None
        final_XTC = self.model.forward_layers(resid_XTC, start, intervention)
        return pass_sums(self.model, final_XTC, clean.targets, self.metric, copies=P)

    def suffix_pass(
        self,
        clean: CleanPass,
        gates_XLH: Tensor,
        start: int,
        touched_L: Tensor,
        replacements: list[Tensor | None] | None,
        where_XT: Tensor | None,
        P: int,
    ) -> tuple[Tensor, Tensor]:
        """masked_pass at the layout's positions only: the same numbers, the skipped positions' clean stream kept."""
        layout, model = clean.layout, self.model
        where_XS = None if where_XT is None else layout.gather(where_XT)
        if replacements is not None:
            replacements = [slot_values(layout, r, len(gates_XLH)) for r in replacements]
        resid_XSC = layout.gather(clean.resid_pre[start]).repeat(P, 1, 1)
        gates = Gates(gates_XLH, replacements, where_XS)
        first = start
        if self.clean_attention:
            z_XSHD = gates(layout.gather(clean.z[start]).repeat(P, 1, 1, 1), Site("attn.z", start))
            resid_XSC = model.blocks[start].finish(resid_XSC, z_XSHD)
            first += 1
        later = gates if touched_L[first:].any() else None
        # The last layer's output counts at the score points only: from each example's first point on
        last_layout, last_slots_BQ = layout.from_first_point(clean.targets.where_BT)
        narrow = last_layout.S < layout.S
        for layer in range(first, model.n_layers):
            last = narrow and layer == model.n_layers - 1
            queries_XQ = last_slots_BQ.repeat(P, 1) if last else None
            resid_XSC = suffix_block(model.blocks[layer], resid_XSC, layout, clean.clean_kv[layer], later, queries_XQ)
        written = last_layout if narrow and first < model.n_layers else layout
        final_XTC = written.scatter_into(clean.resid_pre[-1].repeat(P, 1, 1), resid_XSC)
        return pass_sums(model, final_XTC, clean.targets, self.metric, copies=P)

    def gate_positions(self, clean: CleanPass, position_P: Tensor) -> Tensor | None:
        """(P * B, T) where each mask's gates act: the mode's positions (aligned patching), and the one position a
        mask names; None when both are every position."""
        where_BT, B, T = clean.replacement.where_BT, *clean.resid_pre[0].shape[:2]
        if where_BT is None and bool((position_P < 0).all()):
            return None
        where_PBT = torch.ones(len(position_P), B, T, dtype=torch.bool, device=self.device)
        if where_BT is not None:
            where_PBT &= where_BT
        for p, column in enumerate(position_P.tolist()):
            if column >= 0:
                named_B = clean.named_pos[:, column]
                where_PBT[p] &= torch.arange(T, device=self.device)[None] == named_B[:, None]
        return where_PBT.flatten(0, 1)


def pass_sums(
    model: Transformer, final_XTC: Tensor, targets: Targets, metric: Metric, copies: int = 1
) -> tuple[Tensor, Tensor]:
    """batch_sums' (copies, K) sums, and from the same per-point values (copies, B): each example's primary column
    summed over its points, which the bootstrap over examples resamples at no extra pass."""
    values_XNK = point_values(model, final_XTC, targets, metric, copies).double()
    example_N = targets.where_BT.nonzero()[:, 0]
    per_example = torch.zeros(copies, targets.where_BT.shape[0], dtype=torch.float64, device=values_XNK.device)
    return values_XNK.sum(dim=1), per_example.index_add_(1, example_N, values_XNK[..., 0])


def repeated_replacements(
    replacements: list[Tensor | None] | None, touched_L: Tensor, P: int
) -> list[Tensor | None] | None:
    """Per-example replacements (B, T, H, D) repeated for P masks; none where no mask of the pass touches a layer
    (a gate of 1 ignores its replacement)."""
    if replacements is None:
        return None
    return [
        None if not touched or r is None else r.repeat(P, 1, 1, 1) if r.ndim == 4 else r
        for r, touched in zip(replacements, touched_L.tolist())
    ]


def slot_values(layout: SuffixLayout, replacement: Tensor | None, X: int) -> Tensor | None:
    """A replacement at the layout's slots: per example and position (X, T, H, D) or per position (T, H, D) gathered,
    a constant per head (H, D) as it is."""
    if replacement is None or replacement.ndim == 2:
        return replacement
    if replacement.ndim == 3:
        replacement = replacement.expand(X, *replacement.shape)
    return layout.gather(replacement)


def mask_bytes_per_example(
    model: Transformer, seq_len: int, per_example: bool, logits: int, keys: int | None = None
) -> int:
    """A generous estimate of the activations one example of one mask holds during a pass over seq_len positions
    attending to `keys` keys (default seq_len): one layer at work, the `logits` floats the metric reads, and for
    per-example replacements (resample, patch) every layer's z repeated."""
    sizes = model.activation_floats(keys or seq_len)
    floats = seq_len * sizes.layer + logits
    if per_example:
        floats += model.n_layers * seq_len * sizes.z
    return floats * next(model.parameters()).element_size()


def clean_bytes_per_example(model: Transformer, seq_len: int, per_example: bool) -> int:
    """What the clean pass keeps per example for the masks of its batch: the stream before each layer and each
    layer's z, and for per-example replacements the sources' z."""
    sizes = model.activation_floats(seq_len)
    floats = model.n_layers * seq_len * (sizes.resid + sizes.z * (2 if per_example else 1))
    return floats * next(model.parameters()).element_size()
