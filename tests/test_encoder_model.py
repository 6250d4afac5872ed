"""The configurable model's encoder parts: named sites on a bidirectional post-LN model (hooks that change nothing
give the plain logits bit for bit; per-layer streams are transformers' hidden states), sinusoidal positions, BERT's
masked-LM objective against transformers' loss, and bad settings as one line each."""

import math

import pytest
import torch

pytest.importorskip("transformers")

from encoder_helpers import converted, hf_model, inputs  # noqa: E402

from headcount.config.model import ModelConfig  # noqa: E402
from headcount.errors import ConfigError  # noqa: E402
from headcount.model.intervention import Intervention  # noqa: E402
from headcount.model.mlm import IGNORE, mask_tokens, masked_lm_loss  # noqa: E402
from headcount.model.sites import parse_site  # noqa: E402
from headcount.model.transformer import Transformer, sinusoid  # noqa: E402
from headcount.pretrained import convert  # noqa: E402

CASE = "bert_mlm_tanh_gelu"


def run(model, hooks, case=CASE, **kwargs):
    x = inputs(case)
    return model(x["input_ids"], token_types=x["token_type_ids"], intervention=Intervention(hooks), **kwargs)


def test_identity_hooks_at_every_site_give_the_plain_logits_bit_for_bit():
    _, model = converted(CASE, torch.float64)
    x = inputs(CASE)
    names = [s for s in site_names(model) if not s.endswith(("q_input", "k_input", "v_input", "pattern"))]
    with torch.no_grad():
        plain = model(x["input_ids"], token_types=x["token_type_ids"])
        hooked = run(model, [(name, lambda t, site: None) for name in names])
    assert torch.equal(plain, hooked)


def site_names(model):
    layer_sites = [
        "resid_pre", "attn.q_input", "attn.k_input", "attn.v_input", "attn.q", "attn.k", "attn.v", "attn.pattern",
        "attn.z", "attn_out", "mlp_in", "mlp.hidden", "mlp_out", "resid_post",
    ]  # fmt: skip
    blocks = [f"blocks.{layer}.{kind}" for layer in range(model.n_layers) for kind in layer_sites]
    return ["embed", *blocks, "final_norm", "logits"]


def test_heads_from_their_own_inputs_and_the_explicit_pattern_agree_on_an_encoder():
    _, model = converted(CASE, torch.float64)
    x = inputs(CASE)
    with torch.no_grad():
        plain = model(x["input_ids"], token_types=x["token_type_ids"])
        per_head = run(
            model, [("blocks.1.attn.q_input", lambda t, s: None), ("blocks.0.attn.pattern", lambda t, s: None)]
        )
    torch.testing.assert_close(per_head, plain, rtol=0, atol=1e-12)


def test_each_layers_stream_is_transformers_hidden_state_and_the_pattern_is_bidirectional():
    hf, model = converted(CASE, torch.float64)
    x = inputs(CASE)
    cache = {}

    def keep(t, site):
        cache[site.name] = t.clone()

    names = ["embed"] + [f"blocks.{layer}.resid_post" for layer in range(2)] + ["blocks.0.attn.pattern"]
    with torch.no_grad():
        hidden = hf(**x, output_hidden_states=True).hidden_states
        run(model, [(name, keep) for name in names])
    for i, name in enumerate(names[:3]):
        torch.testing.assert_close(cache[name], hidden[i], rtol=0, atol=1e-10)
    pattern = cache["blocks.0.attn.pattern"]
    assert pattern.triu(1).abs().sum() > 0  # queries attend to later keys: no causal mask
    torch.testing.assert_close(pattern.sum(-1), torch.ones_like(pattern[..., 0]))
    assert parse_site("blocks.1.attn.z").layer == 1


def test_sinusoidal_positions_are_the_original_transformers_table():
    from transformers.models.distilbert.modeling_distilbert import _create_sinusoidal_embeddings

    theirs = _create_sinusoidal_embeddings(20, 16, torch.empty(20, 16))
    torch.testing.assert_close(sinusoid(20, 16, torch.device("cpu")).float(), theirs, rtol=0, atol=1e-6)
    t, i = 7, 3  # PE(t, 2i) = sin(t / 10000^(2i / C)), PE(t, 2i + 1) = cos(...)
    table = sinusoid(20, 16, torch.device("cpu"))
    assert table[t, 2 * i] == pytest.approx(math.sin(t / 10000 ** (2 * i / 16)), abs=1e-15)
    assert table[t, 2 * i + 1] == pytest.approx(math.cos(t / 10000 ** (2 * i / 16)), abs=1e-15)
    model = Transformer(ModelConfig(d_model=16, positions="sinusoidal", n_ctx=20)).double()
    idx = torch.randint(0, 256, (2, 9))
    assert not any("pos_emb" in name for name, _ in model.named_parameters())
    torch.testing.assert_close(model.embed(idx) - model.tok_emb(idx), table[:9].expand(2, 9, 16), rtol=0, atol=1e-15)


@pytest.mark.parametrize("case", ["bert_mlm_tanh_gelu", "electra_mlm_narrow_embeddings"])
def test_masked_lm_loss_is_transformers_loss_on_the_chosen_positions(case):
    hf, model = converted(case, torch.float64)
    x = inputs(case)
    corrupted, labels = mask_tokens(x["input_ids"], mask_id=3, vocab_size=60, share=0.3, generator=torch.Generator())
    assert (labels != IGNORE).any() and (labels == IGNORE).any()
    with torch.no_grad():
        expected = hf(input_ids=corrupted, token_type_ids=x["token_type_ids"], labels=labels).loss
        ours = masked_lm_loss(model(corrupted, token_types=x["token_type_ids"]), labels)
    torch.testing.assert_close(ours, expected, rtol=0, atol=1e-10)


def test_bert_masking_chooses_a_share_and_splits_it_80_10_10():
    idx = torch.randint(10, 1000, (200, 500), generator=torch.Generator().manual_seed(0))
    corrupted, labels = mask_tokens(idx, mask_id=0, vocab_size=1000, generator=torch.Generator().manual_seed(1))
    chosen = labels != IGNORE
    assert chosen.float().mean().item() == pytest.approx(0.15, abs=0.003)
    assert torch.equal(labels[chosen], idx[chosen]) and torch.equal(corrupted[~chosen], idx[~chosen])
    masked = (corrupted == 0)[chosen].float().mean().item()
    kept = (corrupted == idx)[chosen].float().mean().item()  # kept on purpose, plus random draws of the same token
    assert masked == pytest.approx(0.8, abs=0.01) and kept == pytest.approx(0.1, abs=0.01)


def test_a_decoder_has_none_of_the_encoder_parts():
    names = set(Transformer(ModelConfig(mlp=True)).state_dict())
    new = ("type_emb", "ln_emb", "emb_proj", "mlm.", "_add.", "lm_head.bias")
    assert not [n for n in names if any(part in n for part in new)]
    assert ModelConfig().causal and not ModelConfig().post_ln


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"post_ln": True}, "model.post_ln=True: needs model.pre_norm=false, model.post_norm=false and"),
        ({"causal": False, "sliding_window": 4}, "model.sliding_window=4: must be null when model.causal=false"),
        ({"type_vocab_size": -1}, "model.type_vocab_size=-1: must be 0 (none) or a positive integer"),
        ({"d_embed": 0}, "model.d_embed=0: must be a positive integer or null (d_model)"),
        ({"position_offset": 2, "positions": "rotary"}, "model.position_offset=2: must be 0, or positive with"),
        ({"d_embed": 16, "tie_embeddings": True}, "model.d_embed=16: needs model.mlm_head=true"),
    ],
)
def test_bad_encoder_settings_are_one_line(changes, message):
    with pytest.raises(ConfigError) as err:
        Transformer(ModelConfig(**changes))
    assert str(err.value).startswith(message) and "\n" not in str(err.value)


def test_token_types_on_a_model_without_them_are_refused():
    model = Transformer(ModelConfig())
    with pytest.raises(ConfigError, match="token_types=.*need model.type_vocab_size > 0"):
        model(torch.zeros(1, 4, dtype=torch.long), token_types=torch.zeros(1, 4, dtype=torch.long))


def test_a_bare_encoder_reads_its_hidden_states_through_a_tied_readout():
    hf = hf_model("bert_bare")
    model = convert(hf)
    assert not model.cfg.mlm_head and model.lm_head.weight is model.tok_emb.weight and model.lm_head.bias is None


def test_next_token_loss_on_an_encoder_is_refused_in_one_line():
    from headcount.api_model import HookedModel

    _, model = converted(CASE)
    with pytest.raises(ConfigError, match=r"^model.causal=False: loss is next-token cross-entropy, which needs true"):
        HookedModel(model).loss(inputs(CASE)["input_ids"])
