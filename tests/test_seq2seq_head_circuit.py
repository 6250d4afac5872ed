"""head_circuit on an encoder-decoder's task (ablation/scans/head_circuit.py): heads named by kind, every other head
patched through the seq2seq evaluator; faithfulness and the circuit's metric equal a hand computation (float64) from
Run.evaluate's masks of the same heads; random circuits are named by kind; a top-k entry reads a ranking's grid."""

import pytest
import torch

from headcount.errors import ConfigError

SPEC = {"source": "translation_verb", "n_prompts": 12}


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    from seq2seq_cases import trained_translation_run

    path = tmp_path_factory.mktemp("seq2seq_circuit_run")
    trained_translation_run(path)
    return path


def everything_but(run, kept: list[str]) -> str:
    grid = run.model.heads_per_layer
    labels = [grid.head_label(row, h) for row, n in enumerate(grid) for h in range(n)]
    return "+".join(label for label in labels if label not in kept)


def test_head_circuit_faithfulness_of_every_kind_equals_run_evaluate_by_hand(trained):
    import headcount

    run = headcount.load_run(trained, device="cpu")
    kept = ["enc.L0H1", "dec.L1H0", "cross.L1H0", "cross.L1H1"]
    table = run.scan("head_circuit", mode="patch", task=SPEC, heads=["enc.L0H1", "dec.L1H0", "cross.L1"], random_sets=3)
    circuit = table.iloc[0]
    assert circuit["mask"] == "circuit: " + "+".join(kept)
    assert circuit["kept"] == " ".join(kept)
    assert (circuit["kept_enc"], circuit["kept_dec"], circuit["kept_cross"]) == (1, 1, 2)
    assert circuit["n_heads_off"] == 12 - 4
    masks = {"circuit": everything_but(run, kept), "none": everything_but(run, [])}
    for name in table["mask"].iloc[2:]:
        heads = name.split(": ")[1].split("+")
        assert len(heads) == 4 and all(h.split(".")[0] in ("enc", "dec", "cross") for h in heads)
        masks[name] = everything_but(run, heads)
    evaluated = run.evaluate(masks, mode="patch", task=SPEC).set_index("mask")
    value = evaluated["logit_diff"].astype("float64")
    clean = float(value["none"] - evaluated.loc["none", "delta_logit_diff"])
    by_hand = (value - value["none"]) / (clean - value["none"])
    assert circuit["logit_diff"] == pytest.approx(value["circuit"], abs=1e-9)
    assert circuit["faithfulness"] == pytest.approx(by_hand["circuit"], rel=1e-9, abs=1e-12)
    assert table.iloc[1]["faithfulness"] == 0 and table.iloc[1]["kept"] == ""
    for row in table.iloc[2:].itertuples():
        assert row.faithfulness == pytest.approx(by_hand[row.mask], rel=1e-9, abs=1e-12)
    assert abs(by_hand["circuit"]) > 1e-3  # the circuit differs from no head kept: the check binds
    assert (table["faithfulness_ci_low"] <= table["faithfulness_ci_high"]).all()
    assert torch.isfinite(torch.tensor(table["faithfulness_ci_low"].to_numpy())).all()
    summary = run.summary("patch", "logit_diff", task="translation_verb")["head_circuit"]["head_circuit"]
    assert summary["heads"] == kept and summary["faithfulness"] == pytest.approx(by_hand["circuit"], rel=1e-9)


def test_head_circuit_top_k_reads_the_ranking_of_every_kind_and_bad_names_are_one_line(trained):
    import headcount

    run = headcount.load_run(trained, device="cpu")
    single = run.scan("single_head", mode="patch", task=SPEC)
    ranked = single.sort_values("delta_logit_diff", kind="stable")["mask"].tolist()[:3]  # damage: the decrease
    table = run.scan("head_circuit", mode="patch", task=SPEC, heads=["top3:single_head"], random_sets=0)
    assert sorted(table.iloc[0]["kept"].split()) == sorted(ranked)
    for heads, line in (
        (["L0H1"], "ablation.scans.head_circuit.heads='L0H1': an encoder-decoder's heads are named by kind"),
        (["cross.L2H0"], "ablation.scans.head_circuit.heads='cross.L2H0': no such layer"),
        (["top3:single_head.q"], "ablation.scans.head_circuit.heads='top3:single_head.q': names heads' .q inputs"),
    ):
        with pytest.raises(ConfigError) as error:
            run.scan("head_circuit", mode="patch", task=SPEC, heads=heads)
        assert str(error.value).startswith(line)
