"""An encoder-decoder's direct effects (ablation/methods/seq2seq_direct_effect.py) equal a hand computation from
activations read by torch hooks: each decoder self-attention and cross-attention head's slice of its output
projection's input times that slice of the weight, through the final norm with the run's own scale, onto the target
token's unembedding row (times d_model^(-1/2) for T5 v1.0's tied unembedding), averaged over the teacher-forced score
points; on a tiny random encoder-decoder (LayerNorm) and on transformers' own T5 v1.0 and v1.1 (RMSNorm), converted,
in float32 and float64. Encoder heads have none (NaN); post-LN decoders (BART) are refused by name."""

import pandas as pd
import pytest
import torch
from seq2seq_cases import pairs, tiny_seq2seq
from test_seq2seq_scans import trained  # noqa: F401 (a fixture: a tiny trained encoder-decoder)

from headcount.ablation.engine.metrics import Loss
from headcount.ablation.methods.direct_effect import refusal
from headcount.ablation.methods.seq2seq_direct_effect import seq2seq_direct_effect_sums
from headcount.errors import ConfigError

TOLERANCE = {torch.float32: 1e-5, torch.float64: 1e-11}
DTYPES = [torch.float32, torch.float64]


def hand_direct_effects(forward, out_projections: dict, final_norm, rms: bool, unembedding, scale: float, batch):
    """{kind: (L, H) float64}: each head's direct effect by hand, from the inputs of the modules `out_projections`
    names by kind, one a layer (their input: the layer's H heads concatenated, out_projections[kind][1] = H), and of
    the final norm, read by forward pre-hooks."""
    seen, handles = {}, []
    for kind, (modules, _) in out_projections.items():
        for layer, module in enumerate(modules):
            hook = lambda m, args, key=(kind, layer): seen.__setitem__(key, args[0].double())  # noqa: E731
            handles.append(module.register_forward_pre_hook(hook))
    handles.append(final_norm.register_forward_pre_hook(lambda m, args: seen.__setitem__("final", args[0].double())))
    try:
        with torch.no_grad():
            forward()
    finally:
        for handle in handles:
            handle.remove()
    points = batch["loss_mask"][:, 1:].bool()  # position t predicts input_ids[t + 1]
    answers = batch["input_ids"][:, 1:][points]
    stream_NC = seen["final"][:, :-1][points]
    if rms:
        sigma_N1 = (stream_NC.pow(2).mean(-1, keepdim=True) + final_norm.variance_epsilon).sqrt()
    else:
        sigma_N1 = (stream_NC.var(-1, unbiased=False, keepdim=True) + final_norm.eps).sqrt()
    weight_C, rows_NC = final_norm.weight.double(), unembedding.double()[answers] * scale
    effects = {}
    for kind, (modules, n_heads) in out_projections.items():
        per_layer = []
        for layer, module in enumerate(modules):
            z_NX = seen[(kind, layer)][:, :-1][points]
            W_CX = module.weight.double()
            heads, D = [], W_CX.shape[1] // n_heads
            for h in range(n_heads):
                c_NC = z_NX[:, h * D : (h + 1) * D] @ W_CX[:, h * D : (h + 1) * D].T
                if not rms:
                    c_NC = c_NC - c_NC.mean(-1, keepdim=True)
                heads.append(float((c_NC / sigma_N1 * weight_C * rows_NC).sum(-1).mean().detach()))
            per_layer.append(heads)
        effects[kind] = torch.tensor(per_layer, dtype=torch.float64)
    return effects


def by_kind(model, sums_ELH: torch.Tensor, points_E: torch.Tensor) -> dict[str, torch.Tensor]:
    effect_LH = sums_ELH.sum(0) / points_E.sum()
    grid = model.heads_per_layer
    return {kind: effect_LH[grid.kind_rows(kind), : model.head_kinds[kind][1]] for kind in ("enc", "dec", "cross")}


@pytest.mark.parametrize("dtype", DTYPES)
def test_decoder_and_cross_attention_heads_equal_the_hand_computation_and_encoder_heads_have_none(dtype):
    model, batch = tiny_seq2seq(dtype), pairs()
    dec = model.decoder
    projections = {
        "dec": ([block.attn.out for block in dec.blocks], 3),
        "cross": ([block.cross.out for block in dec.blocks], 2),
    }

    def forward():
        model(batch["src_ids"], batch["input_ids"], src_keep=batch["src_mask"])

    expected = hand_direct_effects(forward, projections, dec.ln_f, False, dec.lm_head.weight, 1.0, batch)
    got = by_kind(model, *seq2seq_direct_effect_sums(model, [batch], Loss()))
    for kind in ("dec", "cross"):
        torch.testing.assert_close(got[kind], expected[kind], rtol=0, atol=TOLERANCE[dtype])
        assert got[kind].abs().max() > 1e-3  # the check can fail
    assert got["enc"].isnan().all()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", ["t5_v1_0", "t5_v1_1"])
def test_converted_t5_s_direct_effects_equal_the_hand_computation_on_transformers_own_model(case, dtype, monkeypatch):
    pytest.importorskip("transformers")
    import transformers as tf
    from seq2seq_helpers import converted, inputs, out_projection, t5_norm_in_its_dtype

    monkeypatch.setattr(tf.models.t5.modeling_t5.T5LayerNorm, "forward", t5_norm_in_its_dtype)
    hf, model = converted(case, dtype)
    src, tgt = inputs()
    loss_mask = torch.ones_like(tgt, dtype=torch.bool)
    loss_mask[:, 0] = False
    batch = {"src_ids": src, "input_ids": tgt, "loss_mask": loss_mask}
    n_layers, n_heads = hf.config.num_decoder_layers, hf.config.num_heads
    projections = {
        kind: ([out_projection(hf, kind, layer) for layer in range(n_layers)], n_heads) for kind in ("dec", "cross")
    }
    scaled = hf.config.scale_decoder_outputs  # v1.0's tied unembedding reads its input times d_model^(-1/2)
    scale = hf.config.d_model**-0.5 if scaled else 1.0

    def forward():
        hf(input_ids=src, decoder_input_ids=tgt)

    expected = hand_direct_effects(forward, projections, hf.decoder.final_layer_norm, True, hf.lm_head.weight, scale,
                                   batch)  # fmt: skip
    got = by_kind(model, *seq2seq_direct_effect_sums(model, [batch], Loss()))
    for kind in ("dec", "cross"):
        torch.testing.assert_close(got[kind], expected[kind], rtol=0, atol=TOLERANCE[dtype] * 10)
        assert got[kind].abs().max() > 1e-3
    assert got["enc"].isnan().all()
    assert model.decoder.cfg.unembed_scale == scaled == (case == "t5_v1_0")  # both forms bind


def test_a_post_ln_decoder_is_refused_by_name():
    pytest.importorskip("transformers")
    from seq2seq_helpers import converted

    _, model = converted("bart")
    assert refusal(model) == (
        "model.post_ln=true: the stream is normalised after every addition, so a head's output reaches the logits "
        "through every later norm and is no term of the final stream"
    )


def test_direct_effect_scan_on_a_trained_encoder_decoder_names_kinds_and_marks_the_encoder_s_heads(trained):  # noqa: F811
    """A row per head of every kind; dec and cross rows are the method's, with intervals; enc rows NaN with
    direct_path false and the reason in summary.json; top_heads by direct_effect never picks an encoder head."""
    import headcount
    from headcount.ablation.methods.seq2seq_direct_effect import NO_DIRECT_PATH

    run = headcount.load_run(trained, device="cpu")
    table = run.scan("direct_effect")
    assert list(table.columns[:6]) == ["kind", "layer", "head", "direct_effect", "direct_path", "direct_effect_ci_low"]
    assert table["kind"].value_counts().to_dict() == {"enc": 4, "dec": 4, "cross": 4}
    assert table["direct_path"].tolist() == (table["kind"] != "enc").tolist()
    grid = run.model.heads_per_layer
    sums_ELH, points_E = seq2seq_direct_effect_sums(run.model, run.finished.eval_batches(), Loss())
    effect_LH = sums_ELH.sum(0) / points_E.sum()
    for row in table.itertuples():
        expected = float(effect_LH[grid.row(row.kind, row.layer), row.head])
        if row.kind == "enc":
            assert pd.isna(row.direct_effect) and pd.isna(row.direct_effect_ci_low) and pd.isna(row.top_share)
        else:
            assert row.direct_effect == pytest.approx(expected, rel=1e-9, abs=1e-12)
            assert row.direct_effect_ci_low <= row.direct_effect_ci_high and 0 <= row.top_share <= 1
    summary = run.summary("zero")
    assert summary["no_direct_path"]["direct_effect"] == {"enc": NO_DIRECT_PATH}
    assert (trained / "ablation" / "direct_effect.png").exists()
    assert (trained / "ablation" / "direct_effect_intervals.png").exists()
    top = run.scan("top_heads", rank_by="direct_effect", top_fraction=0.25)
    heads = top.iloc[0]["mask"].split(": ")[1].split("+")
    by_effect = table[table["direct_path"]].sort_values("direct_effect", ascending=False, kind="stable")
    assert heads == [f"{r.kind}.L{r.layer}H{r.head}" for r in by_effect.head(3).itertuples()]
    with pytest.raises(ConfigError) as error:
        run.scan("direct_effect", backup_top_k=2)
    assert str(error.value) == (
        "ablation.scans.direct_effect.backup_top_k=2: self-repair's joint mean ablation is one stack's; an "
        "encoder-decoder takes 0"
    )


def test_a_ranking_by_direct_effect_puts_the_encoder_s_heads_after_every_negative_one():
    """What the scan hands top_heads: each head at its grid row, an encoder head -inf (read back from the CSV, its NaN
    is an empty field), so a ranking reaches no encoder head before every head with a direct path."""
    from types import SimpleNamespace

    from headcount.ablation.engine.heads import top_heads
    from headcount.ablation.scans.direct_effect import DirectEffectScan
    from headcount.ablation.session import AblationSession

    grid = tiny_seq2seq(torch.float64).heads_per_layer
    rows = [grid.rows[row] + (head,) for row in range(len(grid)) for head in range(grid[row])]
    table = pd.DataFrame(rows, columns=["kind", "layer", "head"])
    table["direct_effect"] = [("" if kind == "enc" else -1.0 - i) for i, (kind, _, _) in enumerate(rows)]
    handed = {}
    session = SimpleNamespace(heads_per_layer=grid, hand=handed.__setitem__)
    session.layer_head_tensor = lambda t, column: AblationSession.layer_head_tensor(session, t, column)
    scan = object.__new__(DirectEffectScan)
    scan.session = session
    scan.use(table)
    ranked = top_heads(handed["direct_effect"], grid, int((table["kind"] != "enc").sum()))
    assert {grid.rows[row][0] for row, _ in ranked} == {"dec", "cross"}
    assert handed["direct_effect"][grid.kind_rows("enc")].eq(float("-inf")).all()
