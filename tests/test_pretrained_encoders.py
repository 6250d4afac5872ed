"""Encoders converted exactly: BERT, RoBERTa, DistilBERT and ELECTRA give transformers' eager MLM logits (a bare
encoder its hidden states) in float32 (1e-5) and float64 (1e-10); every head's zero ablation equals transformers with
that head's slice of the output projection's input zeroed; switching any converted feature off breaks the match."""

import copy

import pytest
import torch

pytest.importorskip("transformers")

from encoder_helpers import CASES, converted, hf_output, our_output, out_projection  # noqa: E402

from headcount.model.intervention import gated, reads
from headcount.model.transformer import Transformer  # noqa: E402

TOL = {torch.float32: 1e-5, torch.float64: 1e-10}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("case", list(CASES))
def test_converted_encoder_gives_transformers_outputs(case, dtype):
    hf, model = converted(case, dtype)
    with torch.no_grad():
        expected = hf_output(hf, case)
        got = our_output(model, case)
        # the explicit softmax path (the one that returns patterns) agrees too
        patterned = our_output(model, case, reads(["attn.pattern"], range(model.n_layers)))
    assert got.dtype == dtype and not model.training and not model.cfg.causal and model.cfg.post_ln
    torch.testing.assert_close(got, expected, rtol=0, atol=TOL[dtype])
    torch.testing.assert_close(patterned, expected, rtol=0, atol=TOL[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("case", list(CASES))
def test_every_head_zero_ablated_equals_its_slice_zeroed_in_transformers(case, dtype):
    hf, model = converted(case, dtype)
    L, H, D = model.n_layers, model.max_heads, model.head_dim
    for layer in range(L):
        for head in range(H):

            def zero_head(module, args, head=head):
                z = args[0].clone()
                z[..., head * D : (head + 1) * D] = 0
                return (z,)

            gates = torch.ones(L, H, dtype=dtype)
            gates[layer, head] = 0
            handle = out_projection(hf, layer).register_forward_pre_hook(zero_head)
            try:
                with torch.no_grad():
                    expected = hf_output(hf, case)
            finally:
                handle.remove()
            with torch.no_grad():
                got = our_output(model, case, gated(gates))
            torch.testing.assert_close(got, expected, rtol=0, atol=TOL[dtype], msg=f"L{layer}H{head}")


def switched(model: Transformer, **changes) -> Transformer:
    """The converted model rebuilt with config changes, keeping every weight whose name and shape still fit."""
    cfg = copy.deepcopy(model.cfg)
    for key, value in changes.items():
        setattr(cfg, key, value)
    torch.manual_seed(0)
    other = Transformer(cfg).to(next(model.parameters()).dtype).eval()
    theirs = other.state_dict()
    kept = {k: v for k, v in model.state_dict().items() if k in theirs and theirs[k].shape == v.shape}
    other.load_state_dict(kept, strict=False)
    return other


SWITCHES = [
    ("bert_mlm_tanh_gelu", "bidirectional", {"causal": True}),
    ("bert_mlm_tanh_gelu", "post_ln", {"post_ln": False, "pre_norm": True}),
    ("bert_mlm_tanh_gelu", "token_types", {"type_vocab_size": 0}),
    ("bert_mlm_tanh_gelu", "embed_norm", {"embed_norm": False}),
    ("bert_mlm_tanh_gelu", "mlm_head", {"mlm_head": False}),
    ("bert_mlm_tanh_gelu", "tanh_gelu", {"mlp_act": "gelu"}),
    ("bert_bare", "bidirectional", {"causal": True}),
    ("bert_bare", "post_ln", {"post_ln": False, "pre_norm": True}),
    ("roberta_mlm", "position_offset", {"position_offset": 0, "n_ctx": 24}),
    ("roberta_mlm", "final_norm", {"final_norm": True}),
    ("distilbert_mlm", "post_ln", {"post_ln": False, "pre_norm": True}),
    ("distilbert_mlm", "mlm_head", {"mlm_head": False}),
    ("electra_mlm_narrow_embeddings", "embed_norm", {"embed_norm": False}),
    ("electra_mlm_narrow_embeddings", "bidirectional", {"causal": True}),
]


@pytest.mark.parametrize(("case", "feature", "changes"), SWITCHES, ids=[f"{c}-{f}" for c, f, _ in SWITCHES])
def test_switching_a_converted_feature_off_breaks_the_match(case, feature, changes):
    hf, model = converted(case, torch.float64)
    with torch.no_grad():
        expected = hf_output(hf, case)
        got = our_output(switched(model, **changes), case)
    assert (got - expected).abs().max() > 1e-6, f"{feature} off still matched"  # float64 tolerance: 1e-10


@pytest.mark.parametrize("case", list(CASES))
def test_an_encoder_prunes_structurally_to_its_masked_self_and_counts_transformers_parameters(case):
    hf, model = converted(case, torch.float64)
    pooler = sum(p.numel() for name, p in hf.named_parameters() if name.startswith("pooler."))  # not converted
    assert model.num_params() == sum(p.numel() for p in hf.parameters()) - pooler
    assert (pooler > 0) == case.endswith("bare")
    keep = torch.ones(2, 4, dtype=torch.bool)
    keep[0, 1] = keep[1, 3] = False
    pruned = model.select_heads(keep)
    with torch.no_grad():
        masked = our_output(model, case, gated(keep.double()))
        torch.testing.assert_close(our_output(pruned, case), masked, rtol=0, atol=1e-10)
    assert pruned.heads_per_layer == [3, 3] and not pruned.cfg.causal
