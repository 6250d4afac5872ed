"""A transformers causal LM converted into headcount's Transformer: the config it implies, then its weights.

The conversion is exact: the converted model computes the same function (equal logits up to float rounding), and the
result is an ordinary Transformer with an ordinary ModelConfig, so checkpoints, the evaluator, importance, L0 gates,
structural export and head-pattern scores work on it unchanged. Dropout is 0: imported models are for analysis.
"""

from typing import Any

import torch
from torch import nn

from headcount.config.model import ModelConfig
from headcount.model.encoder_decoder import EncoderDecoder, build_model
from headcount.model.transformer import Transformer
from headcount.pretrained.checks import refuse_if
from headcount.pretrained.families import FAMILIES, family
from headcount.pretrained.weights import HFWeights


def hf_model_config(hf_config: Any, source: str | None = None) -> ModelConfig:
    """The ModelConfig a transformers config implies; a ConfigError (key model.pretrained) for what headcount's
    model cannot reproduce. source names the checkpoint in messages (default: the config's name or type)."""
    source = source or getattr(hf_config, "_name_or_path", None) or hf_config.model_type
    converter = family(hf_config.model_type, source)
    heterogeneous = bool(getattr(hf_config, "is_heterogeneous", False))
    refuse_if(heterogeneous, source, hf_config.model_type, "with layers of different shapes (per_layer_config)")
    return converter.model_config(hf_config, source)


@torch.no_grad()
def convert(hf_model: nn.Module, source: str | None = None, release: bool = False) -> Transformer:
    """headcount's Transformer equal to hf_model (a transformers *ForCausalLM), in its dtype and on its device, in
    eval mode. hf_model is left as it is; with release, its tensors move into the converted model instead of being
    copied (the peak memory stays near one copy of the weights) and hf_model is left on the meta device, empty."""
    cfg = hf_model_config(hf_model.config, source)  # the family is known from here on
    model_type = hf_model.config.model_type
    params = dict(hf_model.named_parameters(remove_duplicate=False))  # tied weights appear under both names
    # BART's and Marian's logits bias is a buffer; every other buffer is computed from the config
    params |= {name: b for name, b in hf_model.named_buffers() if name.endswith("final_logits_bias")}
    hf = HFWeights({name: p.detach() for name, p in params.items()}, model_type)
    if release:
        device = next(iter(params.values())).device
        del params
        hf_model.to("meta")  # hf now holds the only references: each tensor is freed once converted
        return model_from_state(cfg, FAMILIES[model_type].state_dict(hf, cfg), hf).to(device)
    state = FAMILIES[model_type].state_dict(hf, cfg)
    hf.check_all_taken()
    first = next(iter(params.values()))
    # Building the model draws random init values that the state overwrites; keep the caller's random stream.
    with torch.random.fork_rng(devices=[]):
        model = build_model(cfg).to(dtype=first.dtype)
    model.load_state_dict(state)
    return model.to(first.device).eval()


@torch.no_grad()
def convert_weights(hf_config: Any, hf: HFWeights, source: str | None = None) -> Transformer:
    """headcount's Transformer from a transformers config and its weights by transformers' names, built without a
    second copy of the weights: the model's parameters start on the meta device and take the converted tensors
    themselves, and each of hf's tensors is dropped once converted (hf is emptied). On the CPU, in eval mode."""
    cfg = hf_model_config(hf_config, source)
    return model_from_state(cfg, FAMILIES[hf_config.model_type].state_dict(hf, cfg), hf)


def model_from_state(
    cfg: ModelConfig, state: dict[str, torch.Tensor], hf: HFWeights | None = None
) -> Transformer | EncoderDecoder:
    """A Transformer that holds the tensors of state (headcount's names) as its parameters, not copies of them, after
    checking that the conversion used every one of hf's weights. Buffers (computed from the config) are made as
    usual; a tied unembedding stays tied."""
    from accelerate import init_empty_weights

    if hf is not None:
        hf.check_all_taken()
    with init_empty_weights(), torch.random.fork_rng(devices=[]):
        model = build_model(cfg)
    prefix = "decoder." if cfg.encoder_layers else ""
    if cfg.tie_embeddings:
        state = {**state, f"{prefix}lm_head.weight": state[f"{prefix}tok_emb.weight"]}
    model.load_state_dict(state, assign=True)
    model.tie_weights()
    return model.eval()
