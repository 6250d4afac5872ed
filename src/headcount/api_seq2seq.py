"""The Python API's bare encoder-decoder: what `headcount.load_model(source)` returns for T5, BART, Marian or a
seq2seq run (data=translation_seq2seq), with hooks and a cache at its stack-prefixed sites (model/sites.py).

    model = headcount.load_model("path/to/t5")          # a save_pretrained folder, a Hub name, a run directory
    src, tgt = model.to_tokens("a source"), model.to_target_tokens("its target")
    loss = model.loss(src, tgt, hooks=[("dec.blocks.0.cross.z", zero_head_2)])
    logits, cache = model.run_with_cache(src, model.decoder_input(tgt), names=["enc.out", "dec.blocks.1.resid_pre"])
    ids = model.generate(src, max_new_tokens=20, hooks=[("dec.blocks.0.resid_pre", steer)])

Teacher forcing: the decoder reads the target shifted right behind the start token, [start, y_1, ..., y_{n-1}], and
position t predicts y_{t+1} (model/seq2seq.py), as transformers' `labels` do. Everything runs through the model's own
forward (EncoderDecoder.forward's `intervention`, a `StackIntervention`).
"""

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from headcount.errors import ConfigError
from headcount.model.encoder_decoder import EncoderDecoder, StackIntervention
from headcount.model.intervention import Hook
from headcount.model.seq2seq import greedy_decode
from headcount.model.sites import stack_site_names

HookList = Iterable[tuple[str, Hook]]
Tokens = str | list[str] | Tensor


@dataclass
class HookedSeq2Seq:
    """An encoder-decoder in eval mode with its tokenizer (None where it reads token ids only) and its special ids:
    start_id begins every decoder input, eos_id ends generation (None: never), pad_id marks padded source positions,
    which no head attends to, and target positions the loss skips (None: no padding)."""

    model: EncoderDecoder
    tokenizer: Any = None
    source: str = ""
    start_id: int = 0
    eos_id: int | None = None
    pad_id: int | None = None
    active: list[tuple[str, Hook]] = field(default_factory=list, repr=False)

    @property
    def site_names(self) -> list[str]:
        """Every site, encoder first (enc.embed ... enc.out), then the decoder's (dec.embed ... dec.logits)."""
        return stack_site_names(self.model.encoder.n_layers, self.model.decoder.n_layers, self.model.cfg.mlp)

    def to_tokens(self, text: Tokens) -> Tensor:
        """Source ids (B, S) of a text or texts (the tokenizer's, padded with its pad token), or ids as given."""
        return self._tokens(text, "text")

    def to_target_tokens(self, text: Tokens) -> Tensor:
        """Target ids (B, T) of a text or texts, as the tokenizer encodes targets (its eos included), or ids given."""
        return self._tokens(text, "text_target")

    def _tokens(self, text: Tokens, argument: str) -> Tensor:
        if isinstance(text, Tensor):
            return text if text.ndim == 2 else text[None]
        if self.tokenizer is None:
            raise ConfigError("tokens", text, f"{self.source or 'this model'} has no tokenizer: pass token ids (B, T)")
        texts = [text] if isinstance(text, str) else text
        encoded = self.tokenizer(**{argument: texts}, return_tensors="pt", padding=True)
        return encoded.input_ids.to(next(self.model.parameters()).device)

    def decoder_input(self, target: Tokens) -> Tensor:
        """The teacher-forced decoder input (B, T): start_id, then the target but its last token."""
        ids_BT = self.to_target_tokens(target)
        start_B1 = torch.full_like(ids_BT[:, :1], self.start_id)
        return torch.cat([start_B1, ids_BT[:, :-1]], dim=1)

    def __call__(self, source: Tokens, decoder_input: Tensor) -> Tensor:
        return self.run_with_hooks(source, decoder_input)

    def run_with_hooks(self, source: Tokens, decoder_input: Tensor, hooks: HookList = ()) -> Tensor:
        """The decoder's logits (B, T, V) reading decoder_input (B, T) given the source, with the hooks (and those of
        an open `hooks()` block) at their sites."""
        return self._run(source, decoder_input, StackIntervention([*self.active, *hooks]))

    def run_with_cache(
        self, source: Tokens, decoder_input: Tensor, names: Iterable[str] | None = None, hooks: HookList = ()
    ) -> tuple[Tensor, dict[str, Tensor]]:
        """Logits and {site name: activation} for the named sites (None: every site), after the hooks."""
        intervention = StackIntervention([*self.active, *hooks], self.site_names if names is None else names)
        return self._run(source, decoder_input, intervention), intervention.cache

    def _run(self, source: Tokens, decoder_input: Tensor, intervention: StackIntervention) -> Tensor:
        src_BS = self.to_tokens(source)
        keep = self.source_keep(src_BS)
        return self.model(src_BS, self._ids(decoder_input), src_keep=keep, intervention=intervention)

    @staticmethod
    def _ids(ids: Tensor) -> Tensor:
        if not isinstance(ids, Tensor):
            raise ConfigError("decoder_input", type(ids).__name__, "token ids (B, T): see decoder_input(target)")
        return ids if ids.ndim == 2 else ids[None]

    def source_keep(self, src_BS: Tensor) -> Tensor | None:
        """(B, S) bool, False at padded source positions (pad_id); None where nothing is padded."""
        if self.pad_id is None or not bool((src_BS == self.pad_id).any()):
            return None
        return src_BS != self.pad_id

    @contextmanager
    def hooks(self, hooks: HookList) -> Iterator["HookedSeq2Seq"]:
        """Hooks that every run of this model inside the block applies (loss and generate too), removed on leaving."""
        added = list(hooks)
        StackIntervention(added)  # bad names and hooks fail here, before the block runs
        self.active.extend(added)
        try:
            yield self
        finally:
            del self.active[len(self.active) - len(added) :]

    def loss(self, source: Tokens, target: Tokens, hooks: HookList = ()) -> Tensor:
        """The mean cross-entropy of the target's tokens (teacher forcing), skipping pad_id positions, with the
        hooks: transformers' loss for labels=target."""
        tgt_BT = self.to_target_tokens(target)
        logits_BTV = self.run_with_hooks(source, self.decoder_input(tgt_BT), hooks)
        scored_BT = torch.ones_like(tgt_BT, dtype=torch.bool) if self.pad_id is None else tgt_BT != self.pad_id
        logits_NV = logits_BTV[scored_BT]
        return F.cross_entropy(logits_NV.to(torch.promote_types(logits_NV.dtype, torch.float32)), tgt_BT[scored_BT])

    def generate(self, source: Tokens, max_new_tokens: int, hooks: HookList = ()) -> Tensor:
        """Greedy decoding under the hooks (B, 1 + n): start_id, then the argmax tokens until eos_id or
        max_new_tokens (positions after a sequence's eos hold pad_id, else eos_id). Decoder hooks run at every step
        over the whole prefix, so a hook sees T = 1, 2, ... positions."""
        src_BS = self.to_tokens(source)
        intervention = StackIntervention([*self.active, *hooks])
        keep = self.source_keep(src_BS)
        return greedy_decode(
            self.model, src_BS, self.start_id, max_new_tokens, self.eos_id, self.pad_id, keep, intervention=intervention
        )


def special_ids(config: Any) -> dict[str, int | None]:
    """start_id, eos_id and pad_id from a transformers seq2seq config (decoder_start_token_id, ...)."""
    return {
        "start_id": config.decoder_start_token_id,
        "eos_id": config.eos_token_id,
        "pad_id": config.pad_token_id,
    }
