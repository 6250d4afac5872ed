"""position_attention on an encoder-decoder's task (ablation/methods/seq2seq_position_attention.py): from each
prompt's scored position, each cross-attention head's share on the source tokens the counterpart changes and each
decoder self-attention head's on the decoder stream's changed tokens equal a sum by hand over the heads' own patterns
(seq2seq_head_scores.kind_patterns, checked against the forward's z in test_seq2seq_head_scores.py), in float32 and
float64, over batches of several sizes; encoder heads are NaN (no scored position); the scan names kinds and says
why."""

import json

import pytest
import torch
from test_seq2seq_task import (
    tiny_model,
    trained,  # noqa: F401 (a fixture: a tiny encoder-decoder trained on translation)
)

from headcount.ablation.methods.seq2seq_head_scores import kind_patterns
from headcount.ablation.methods.seq2seq_position_attention import (
    NO_SCORED_POSITION,
    changed_attention_sums,
    changed_tokens,
)
from headcount.ablation.scans.intervals import score_intervals
from headcount.config.task import TaskConfig
from headcount.data.examples import to_batches
from headcount.errors import ConfigError
from headcount.tasks import IdsOnly, build_task

CPU = torch.device("cpu")


def task_of(source: str, n: int = 10):
    tokens = IdsOnly(60, "the synthetic alphabet of data.source=translation_seq2seq", "translation_seq2seq")
    return build_task(TaskConfig(source=source, n_prompts=n), tokens, 16)


def by_hand(model, task, kind: str, row_layer: int, head: int) -> float:
    """The mean over the scored positions of the prompts that change a token the kind reads of the attention from
    that position to those tokens, read one prompt, one query and one key at a time."""
    clean, bad = task.examples(), task.examples(corrupted=True)
    ids, keep = ("src_ids", "src_mask") if kind == "cross" else ("input_ids", "valid")
    total, n = 0.0, 0
    for i in range(len(task)):
        one = {key: value[i : i + 1] for key, value in clean.items()}
        pattern = kind_patterns(model, one)[kind][row_layer][0, head].double()
        changed = [
            k for k in range(clean[ids].shape[1]) if bool(clean[keep][i, k]) and clean[ids][i, k] != bad[ids][i, k]
        ]
        if not changed:
            continue
        for q in task.score_mask[i].nonzero().flatten().tolist():
            total += sum(float(pattern[q, k]) for k in changed)
            n += 1
    return total / n if n else float("nan")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("source", ["translation_verb", "translation_agreement"])
def test_shares_on_the_changed_tokens_equal_a_sum_by_hand_over_each_kind_s_patterns(dtype, source):
    model, task = tiny_model(dtype), task_of(source)
    batches = to_batches(task.examples(), 4, CPU)  # 10 prompts: 4 + 4 + 2, so the offsets matter
    changed = changed_tokens(task.examples(), task.examples(corrupted=True))
    sums_ELH, counts_EL = changed_attention_sums(model, batches, changed)
    share_LH = sums_ELH.sum(0) / counts_EL.sum(0)[:, None]
    grid = model.heads_per_layer
    enc = grid.kind_rows("enc")
    assert sums_ELH[:, enc].isnan().all() and (counts_EL[:, enc] == 0).all() and share_LH[enc].isnan().all()
    assert (changed["cross"].sum(1) == 1).all()  # one source token changes in every prompt
    assert changed["dec"].any(1).all() == (source == "translation_agreement")  # the verb task keeps the stream
    tolerance = 1e-6 if dtype == torch.float32 else 1e-12
    for kind in ("dec", "cross"):
        for layer in range(2):
            for head in range(grid[grid.row(kind, layer)]):
                expected = by_hand(model, task, kind, layer, head)
                got = float(share_LH[grid.row(kind, layer), head])
                if source == "translation_verb" and kind == "dec":
                    assert torch.isnan(torch.tensor(got)) and torch.isnan(torch.tensor(expected))
                else:
                    assert got == pytest.approx(expected, abs=tolerance), (kind, layer, head)
                    assert 0 < got < 1


def test_position_attention_scan_names_kinds_and_leaves_the_encoder_nan_with_its_reason(trained):  # noqa: F811
    import headcount

    run = headcount.load_run(trained, device="cpu")
    spec = {"source": "translation_agreement", "n_prompts": 12}
    table = run.scan("position_attention", mode="patch", task=spec)
    assert list(table.columns[:5]) == ["kind", "layer", "head", "attn_to_changed", "scored_query"]
    assert table["kind"].value_counts().to_dict() == {"enc": 4, "dec": 4, "cross": 4}
    enc = table[table["kind"] == "enc"]
    assert enc["attn_to_changed"].isna().all() and not enc["scored_query"].any()
    task = run.task(spec)
    for row in table[table["scored_query"]].itertuples():
        assert row.attn_to_changed == pytest.approx(by_hand(run.model, task, row.kind, row.layer, row.head), abs=1e-6)
        assert row.attn_to_changed_ci_low <= row.attn_to_changed <= row.attn_to_changed_ci_high
    # each kind's interval: the bootstrap over its prompts' sums and scored positions (intervals.py, seed 0)
    grid, clean = run.model.heads_per_layer, task.examples()
    changed = changed_tokens(clean, task.examples(corrupted=True))
    sums_ELH, counts_EL = changed_attention_sums(run.model, to_batches(clean, 5, CPU), changed)
    for kind in ("dec", "cross"):
        rows = table[table["kind"] == kind]
        grid_rows = [grid.row(kind, layer) for layer in rows["layer"]]
        columns, _ = score_intervals(sums_ELH[:, grid_rows, rows["head"].tolist()], counts_EL[:, grid_rows[0]], "x", 0)
        assert rows["attn_to_changed_ci_low"].tolist() == pytest.approx(columns["x_ci_low"].tolist(), abs=1e-6)
        assert rows["attn_to_changed_ci_high"].tolist() == pytest.approx(columns["x_ci_high"].tolist(), abs=1e-6)
    summary = json.loads((trained / "ablation" / "tasks" / "translation_agreement" / "summary.json").read_text())
    assert summary["mode_independent"]["no_scored_position"]["position_attention"] == {"enc": NO_SCORED_POSITION}
    with pytest.raises(ConfigError) as error:
        run.scan("position_attention", mode="patch", task=spec, from_position="S2")
    assert str(error.value).startswith(
        "ablation.scans.position_attention.from_position='S2': an encoder-decoder's task names no positions"
    )
