"""The Python API's bare model: `headcount.load_model(source)` and interventions at named sites.

    import headcount

    model = headcount.load_model("tiny_random_llama")  # a preset, a model.pretrained source, a checkpoint, a run dir
    tokens = model.to_tokens("The cat sat")
    logits, cache = model.run_with_cache(tokens, names=["blocks.0.attn.z", "blocks.1.resid_post"])
    logits = model.run_with_hooks(tokens, hooks=[("blocks.1.attn.z", zero_head_2)])
    with model.hooks([("blocks.0.resid_pre", steer)]):
        logits = model(tokens)

A hook is fn(tensor, site) -> None or a tensor of the same shape (model/intervention.py); the sites and their shapes
are model/sites.py's. Everything runs through the model's own forward (Transformer.forward's `intervention`).
"""

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from omegaconf import OmegaConf
from torch import Tensor

from headcount.api_seq2seq import HookedSeq2Seq, special_ids
from headcount.config import CONF_DIR
from headcount.errors import ConfigError
from headcount.model.encoder_decoder import EncoderDecoder
from headcount.model.intervention import Hook, Intervention
from headcount.model.sites import Site, site_names
from headcount.model.transformer import Transformer

HookList = Iterable[tuple[str | Site, Hook]]


@dataclass
class HookedModel:
    """A model in eval mode with its tokenizer (None where it reads token ids only: a run trained on bytes or
    synthetic data, a model preset without a checkpoint) and the hooks of an open `hooks()` block."""

    model: Transformer
    tokenizer: Any = None
    source: str = ""
    active: list[tuple[str | Site, Hook]] = field(default_factory=list, repr=False)

    @property
    def site_names(self) -> list[str]:
        return site_names(self.model.n_layers, self.model.cfg.mlp)

    def to_tokens(self, text: str | list[str] | Tensor) -> Tensor:
        """Token ids (B, T) of a text or texts (the tokenizer's, as it encodes them), or ids as given."""
        if isinstance(text, Tensor):
            return text if text.ndim == 2 else text[None]
        if self.tokenizer is None:
            raise ConfigError("tokens", text, f"{self.source or 'this model'} has no tokenizer: pass token ids (B, T)")
        device = next(self.model.parameters()).device
        return self.tokenizer([text] if isinstance(text, str) else text, return_tensors="pt").input_ids.to(device)

    def __call__(self, tokens: str | list[str] | Tensor) -> Tensor:
        return self.run_with_hooks(tokens)

    def run_with_hooks(self, tokens: str | list[str] | Tensor, hooks: HookList = ()) -> Tensor:
        """Logits (B, T, V) with the hooks (and those of an open `hooks()` block) at their sites."""
        intervention = Intervention([*self.active, *hooks])
        return self.model(self.to_tokens(tokens), intervention=intervention if intervention else None)

    def run_with_cache(
        self, tokens: str | list[str] | Tensor, names: Iterable[str] | None = None, hooks: HookList = ()
    ) -> tuple[Tensor, dict[str, Tensor]]:
        """Logits and {site name: activation} for the named sites (None: every site), after the hooks."""
        intervention = Intervention([*self.active, *hooks], self.site_names if names is None else names)
        return self.model(self.to_tokens(tokens), intervention=intervention), intervention.cache

    @contextmanager
    def hooks(self, hooks: HookList) -> Iterator["HookedModel"]:
        """Hooks that every run of this HookedModel inside the block applies, removed on leaving it."""
        added = list(hooks)
        Intervention(added)  # bad names and hooks fail here, before the block runs
        self.active.extend(added)
        try:
            yield self
        finally:
            del self.active[len(self.active) - len(added) :]

    def loss(self, tokens: str | list[str] | Tensor, hooks: HookList = ()) -> Tensor:
        """The mean next-token cross-entropy over every position but the last, with the hooks. An encoder
        (model.causal false) sees the next token, so it is refused: its objective is headcount.model.mlm's."""
        if not self.model.cfg.causal:
            allowed = "loss is next-token cross-entropy, which needs true; an encoder's is the masked-LM loss "
            allowed += "(headcount.model.mlm.masked_lm_loss)"
            raise ConfigError("model.causal", False, allowed)
        ids_BT = self.to_tokens(tokens)
        logits_BTV = self.run_with_hooks(ids_BT, hooks)
        return F.cross_entropy(logits_BTV[:, :-1].flatten(0, 1).float(), ids_BT[:, 1:].flatten())


def load_model(
    source: str | Path, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32
) -> "HookedModel | HookedSeq2Seq":
    """A bare model with its tokenizer, from a model preset's name (conf/model: tiny_random_llama, smollm2_135m, or an
    architecture such as tiny, built with random weights from seed 0), a run directory, a checkpoint file (.ckpt,
    .pt) or any model.pretrained source (a checkpoint folder, a .gguf file, headcount:tiny-random-llama, a Hub name).
    An encoder-decoder (T5, BART, Marian, a seq2seq run) is a HookedSeq2Seq (api_seq2seq.py) with its special ids:
    the checkpoint's config's, the translation task's for a run (or a run's checkpoint) trained on it, else start 0
    and no eos or padding."""
    given = str(source)
    path = Path(given).expanduser()
    tokenizer, ids = None, {}
    if path.is_dir() and (path / ".hydra" / "config.yaml").is_file():
        from headcount.run_dir import load_run

        finished = load_run(path)
        model, pretrained = finished.model, finished.config.model.get("pretrained")
        tokenizer = _tokenizer(pretrained) if pretrained else None
        ids = _run_ids(finished.config, pretrained) if isinstance(model, EncoderDecoder) else {}
    elif path.is_file() and path.suffix in (".ckpt", ".pt"):
        from headcount.run_dir import load_model as load_checkpoint

        model = load_checkpoint(path)
        run_dir = path.parent.parent  # <run>/checkpoints/last.ckpt: the run's data names an encoder-decoder's ids
        if isinstance(model, EncoderDecoder) and (run_dir / ".hydra" / "config.yaml").is_file():
            from headcount.run_dir import load_run_config

            config = load_run_config(run_dir)
            ids = _run_ids(config, config.model.get("pretrained"))
    elif (preset := Path(CONF_DIR) / "model" / f"{given}.yaml").is_file() and "/" not in given:
        settings = OmegaConf.load(preset)
        if settings.get("pretrained"):
            return load_model(settings.pretrained, device, dtype)
        from headcount.model.encoder_decoder import build_model
        from headcount.run_dir import model_config_from_dict

        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            model = build_model(model_config_from_dict(settings))
    else:
        from headcount.pretrained import load_pretrained

        model, tokenizer, _ = load_pretrained(given)
        ids = _pretrained_ids(given) if isinstance(model, EncoderDecoder) else {}
    model = model.to(device=device, dtype=dtype).eval()
    if isinstance(model, EncoderDecoder):
        return HookedSeq2Seq(model, tokenizer, given, **ids)
    return HookedModel(model, tokenizer, given)


def _tokenizer(pretrained: str) -> Any:
    from headcount.pretrained.run_config import raw_tokenizer

    return raw_tokenizer(pretrained)


def _pretrained_ids(pretrained: str) -> dict[str, int | None]:
    """An encoder-decoder checkpoint's start, eos and pad ids, from its transformers config."""
    import transformers

    from headcount.pretrained.source import locate

    name, kwargs = locate(pretrained).from_pretrained_args()
    return special_ids(transformers.AutoConfig.from_pretrained(name, **kwargs))


def _run_ids(config: Any, pretrained: str | None) -> dict[str, int | None]:
    """A seq2seq run's special ids: its pretrained checkpoint's, or the translation task's (BOS starts and pads)."""
    if pretrained:
        return _pretrained_ids(pretrained)
    if config.data.get("source") == "translation_seq2seq":
        from headcount.data.synthetic import BOS
        from headcount.data.translation import EOS

        return {"start_id": BOS, "eos_id": EOS, "pad_id": BOS}
    return {}
