"""The evaluator of an encoder-decoder's masks: the MaskEvaluator's interface (baselines, totals, resumable batches)
over the model's head grid (labels.KindRows: the encoder's layers, the decoder's, then its cross-attention layers).

A mask is (L, H) gates over the grid; a pass splits them into the model's gates by kind and runs
`EncoderDecoder.encode` and `decode_stream` with them, so each mask's result is EncoderDecoder's forward with that
mask's gates (the Python dict gates) read by the metric at the teacher-forced score points: position t predicts the
decoder stream's t + 1 where loss_mask marks it (ablation/engine/metrics.py). One reuse, exact: a mask that switches
no encoder head off reads the clean pass's encoder output, which depends on the encoder's gates alone. P masks share
a pass as the one-stack evaluator's do (the batch repeated P times, mask-major, with per-example gates).

Replacements: mean ablation's means per grid row (seq2seq_z.py), resample's every row's z on the paired reference
example (its source and its target), both as the one-stack modes define them (modes.py)."""

from dataclasses import dataclass

import torch
from torch import Tensor

from headcount.ablation.engine.evaluator import CleanPass, MaskEvaluator, pass_sums
from headcount.ablation.engine.heads import existing_heads
from headcount.ablation.engine.metrics import Loss, Metric, Targets
from headcount.ablation.engine.modes import BatchReplacement, Replacements, Zero
from headcount.ablation.engine.seq2seq_z import grid_z
from headcount.model.encoder_decoder import EncoderDecoder
from headcount.model.memory import default_memory_budget

ENCODER_STARTS, DECODER_STARTS, UNTOUCHED = 0, 1, 2  # what a mask's pass runs: both stacks, the decoder, nothing


@dataclass
class Seq2SeqCleanPass(CleanPass):
    """A clean pass whose resid_pre holds the encoder's output alone, with the batch its masked passes read."""

    batch: dict[str, Tensor] | None = None


class Seq2SeqEvaluator(MaskEvaluator):
    def __init__(
        self,
        model: EncoderDecoder,
        batches: list[dict[str, Tensor]],
        replacements: Replacements | None = None,
        masks_per_pass: int | None = None,
        memory_budget: int | None = None,
        metric: Metric | None = None,
    ):
        """batches: dicts of src_ids and src_mask (B, S), input_ids and loss_mask (B, T), and for resample the paired
        reference's source_ids, source_src_ids and source_src_mask, on the model's device, all of one size but the
        last. masks_per_pass and memory_budget as for MaskEvaluator."""
        self.model = model.eval()
        self.replacements = replacements or Replacements(Zero())
        self.metric = metric or Loss()
        self.prefix_cache, self.clean_attention, self.skip_unchanged = True, False, False
        param = next(model.parameters())
        self.device, self.dtype = param.device, param.dtype
        self.grid = model.heads_per_layer
        B = len(batches[0]["input_ids"])
        if masks_per_pass is None:
            budget = memory_budget or default_memory_budget(model)
            per_mask = self.bytes_per_example(batches[0])
            B = max(1, min(B, budget // (2 * per_mask)))
            masks_per_pass = max(1, budget // (B * per_mask) - 1)
        self.masks_per_pass, self.batch_size = masks_per_pass, B
        self.batches = [
            {key: v[i : i + B] for key, v in batch.items()}
            for batch in batches
            for i in range(0, len(batch["input_ids"]), B)
        ]
        sizes = [len(batch["input_ids"]) for batch in self.batches]
        self.example_starts = [0, *torch.tensor(sizes).cumsum(0).tolist()]
        self.exists_LH = existing_heads(self.grid, max(self.grid), self.device)
        self.kind_rows = {kind: self.grid.kind_rows(kind) for kind in self.grid.kinds()}
        self.kind_heads = {kind: model.head_kinds[kind][1] for kind in self.kind_rows}

    @property
    def gates_shape(self) -> tuple[int, int]:
        return len(self.grid), max(self.grid)

    def bytes_per_example(self, batch: dict[str, Tensor]) -> int:
        """A generous estimate of what one example of one mask holds in a pass: one layer of each stack at work, the
        encoder's output, the logits at its score points and, for per-example replacements, every row's z."""
        (S,), (T,) = batch["src_ids"].shape[1:], batch["input_ids"].shape[1:]
        enc, dec = self.model.encoder.activation_floats(S), self.model.decoder.activation_floats(T)
        floats = S * (enc.layer + enc.resid) + 2 * T * dec.layer + T * dec.logits
        if self.replacements.mode.per_example:
            floats += len(self.grid) * max(S, T) * max(enc.z, dec.z)
        return floats * self.dtype.itemsize

    def layers_run(self, start: int) -> int:
        """What a pass of masks starting at `start` costs, in layers: both stacks' from the encoder, the decoder's
        from the decoder, none for masks that touch no head; plus the clean pass's share."""
        encoder, decoder = self.model.encoder.n_layers, self.model.decoder.n_layers
        return {ENCODER_STARTS: encoder + decoder, DECODER_STARTS: decoder, UNTOUCHED: 0}[start] + 1

    def start_layers(self, gates_MLH: Tensor) -> Tensor:
        """(M,) on CPU: ENCODER_STARTS for a mask that switches an encoder head off, DECODER_STARTS for one that
        touches the decoder's heads only, UNTOUCHED for none (its result is the clean pass's)."""
        touched_ML = self.touched(gates_MLH).cpu()
        encoder = touched_ML[:, self.kind_rows["enc"]].any(1)
        return torch.where(encoder, ENCODER_STARTS, torch.where(touched_ML.any(1), DECODER_STARTS, UNTOUCHED))

    def clean_pass(self, batch: dict[str, Tensor]) -> "Seq2SeqCleanPass":
        model = self.model
        memory_BSC = model.encode(batch["src_ids"], src_keep=batch["src_mask"])
        final_BTC = model.decode_stream(batch["input_ids"], memory_BSC, batch["src_mask"])
        targets = Targets.of(batch)
        sums, example_sums = pass_sums(model.decoder, final_BTC, targets, self.metric)
        # the encoder's output in resid_pre: what a pass that leaves the encoder alone starts from
        replacement = BatchReplacement(self.batch_replacements(batch))
        return Seq2SeqCleanPass([memory_BSC], [], replacement, targets, None, sums, example_sums, batch=batch)

    def batch_replacements(self, batch: dict[str, Tensor]) -> list[Tensor | None] | None:
        return grid_replacements(self.model, self.replacements, batch)

    def masked_pass(
        self, clean: "Seq2SeqCleanPass", gates_PLH: Tensor, start: int, position_P: Tensor
    ) -> tuple[Tensor, Tensor]:
        """(P, K) metric sums for P masks and (P, B) each example's primary column summed over its points."""
        P = len(gates_PLH)
        if start == UNTOUCHED:
            return clean.sums.expand(P, -1), clean.example_sums.expand(P, -1)
        batch = clean.batch
        B = len(batch["input_ids"])
        gates_XLH = gates_PLH.repeat_interleave(B, dim=0)
        touched_L = self.touched(gates_PLH).any(dim=0).tolist()
        gates, replacements = {}, {}
        values = clean.replacement.values
        for kind, rows in self.kind_rows.items():
            if not any(touched_L[row] for row in rows):
                continue  # every gate of the kind 1: the plain heads, with no gating arithmetic
            gates[kind] = gates_XLH[:, rows, : self.kind_heads[kind]]
            if values is not None:
                replacements[kind] = [repeated(values[row], P) if touched_L[row] else None for row in rows]
        src_keep_XS = batch["src_mask"].repeat(P, 1)
        if start == ENCODER_STARTS:
            src_XS = batch["src_ids"].repeat(P, 1)
            memory_XSC = self.model.encode(src_XS, gates["enc"], replacements.get("enc"), src_keep_XS)
        else:
            memory_XSC = clean.resid_pre[0].repeat(P, 1, 1)
        final_XTC = self.model.decode_stream(
            batch["input_ids"].repeat(P, 1),
            memory_XSC,
            src_keep_XS,
            gates.get("dec"),
            gates.get("cross"),
            replacements,
        )
        return pass_sums(self.model.decoder, final_XTC, clean.targets, self.metric, copies=P)


def repeated(value: Tensor | None, P: int) -> Tensor | None:
    """A per-example replacement (B, X, H, D) repeated for P masks; a mean (H, D) or (X, H, D) as it is."""
    return value.repeat(P, 1, 1, 1) if value is not None and value.ndim == 4 else value


def grid_replacements(
    model: EncoderDecoder, prepared: Replacements, batch: dict[str, Tensor]
) -> list[Tensor | None] | None:
    """Per grid row what an ablated head's z becomes (None: zero): the mode's means, cut to this batch's source or
    target length where per position, or every row's z on the paired reference examples."""
    if prepared.means is not None:
        lengths = [
            batch["src_ids" if kind == "enc" else "input_ids"].shape[1] for kind, _ in model.heads_per_layer.rows
        ]
        return [mean[:n] if mean.ndim == 3 else mean for mean, n in zip(prepared.means, lengths)]
    if prepared.mode.per_example:
        return grid_z(model, batch["source_src_ids"], batch["source_src_mask"], batch["source_ids"])
    return None


def by_kind(model: EncoderDecoder, grid_values: list | Tensor) -> dict:
    """Grid gates (..., L, H) or per-row values (a list) split into the model's by kind: each kind's rows, its gates
    cut to its own heads."""
    grid, heads = model.heads_per_layer, {kind: shape[1] for kind, shape in model.head_kinds.items()}
    if isinstance(grid_values, Tensor):
        return {kind: grid_values[..., grid.kind_rows(kind), : heads[kind]] for kind in grid.kinds()}
    return {kind: [grid_values[row] for row in grid.kind_rows(kind)] for kind in grid.kinds()}
