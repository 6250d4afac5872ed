"""Each batch is split once (issue 33 item 6): examples are split into batches where they enter (data/examples.py
`to_batches`), every batch a view of the one set of examples, and the circuits core takes that set as it is
(ablation/scans/circuit_inputs.py `edge_inputs`): no batch is joined or copied again on the way."""

import torch

from headcount.ablation.engine.modes import Patch, Zero
from headcount.ablation.scans.circuit_inputs import edge_inputs
from headcount.config.model import AttentionConfig, ModelConfig
from headcount.data.examples import ExampleBatches, to_batches
from headcount.model import Transformer


def examples(n: int = 7, T: int = 5) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 20, (n, T), generator=g)
    mask = torch.ones(n, T, dtype=torch.bool)
    mask[:, 0] = False
    return {"input_ids": ids, "loss_mask": mask, "source_ids": torch.randint(0, 20, (n, T), generator=g)}


def same_storage(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()


def test_batches_are_views_of_the_one_set_of_examples_in_order():
    data = examples()
    batches = to_batches(data, 3, torch.device("cpu"))
    assert isinstance(batches, ExampleBatches) and len(batches) == 3
    assert [len(b["input_ids"]) for b in batches] == [3, 3, 1]  # the last holds the rest
    for key, whole in batches.examples.items():
        assert torch.equal(torch.cat([b[key] for b in batches]), data[key])  # every example once, in order
        assert all(same_storage(b[key], whole) for b in batches)  # views: nothing copied per batch


def test_the_circuits_core_takes_the_examples_as_the_batches_hold_them():
    model = Transformer(ModelConfig(n_layers=1, d_model=16, n_ctx=8, vocab_size=20, attn=AttentionConfig(n_heads=2)))
    batches = to_batches(examples(), 3, torch.device("cpu"))
    inputs, targets = edge_inputs(batches, Patch(), model, None, "task")
    assert inputs.clean_ids_BT is batches.examples["input_ids"]  # not joined again from the batches
    assert inputs.corrupted is batches.examples["source_ids"]  # patch: each example's source, as it is
    assert inputs.n_points == int(batches.examples["loss_mask"][:, 1:].sum()) == len(targets)
    zero, _ = edge_inputs(batches, Zero(), model, None, "task")
    assert zero.clean_ids_BT is batches.examples["input_ids"] and zero.corrupted.emb.shape == (7, 5, 16)
