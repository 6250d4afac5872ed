"""headcount.load_model opens a bare model from each kind of source, with its tokenizer where it has one, and a bad
source or bad tokens are one line."""

import dataclasses

import pytest
import torch
from omegaconf import OmegaConf

import headcount
from headcount.errors import ConfigError
from headcount.model import AttentionConfig, ModelConfig, Transformer


def small() -> Transformer:
    torch.manual_seed(0)
    cfg = ModelConfig(d_model=32, n_ctx=16, n_layers=2, vocab_size=50, attn=AttentionConfig(n_heads=4), mlp=True)
    return Transformer(cfg).eval()


def save_checkpoint(model: Transformer, path) -> None:
    """The layout of a Lightning checkpoint of headcount's training module (what run_dir.load_model reads)."""
    hyper = {"model": OmegaConf.to_container(OmegaConf.structured(model.cfg))}
    state = {f"model.{k}": v for k, v in model.state_dict().items()}
    torch.save({"hyper_parameters": hyper, "state_dict": state}, path)


def test_a_checkpoint_file_and_a_run_directory_give_the_same_model(tmp_path):
    model, ids = small(), torch.randint(0, 50, (2, 8))
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / ".hydra").mkdir()
    save_checkpoint(model, run / "checkpoints" / "last.ckpt")
    (run / "metrics.json").write_text("{}")
    config = {"model": dataclasses.asdict(model.cfg)}
    (run / ".hydra" / "config.yaml").write_text(OmegaConf.to_yaml(OmegaConf.create(config)))
    with torch.no_grad():
        expected = model(ids)
        for source in (run / "checkpoints" / "last.ckpt", run):
            opened = headcount.load_model(source)
            assert opened.tokenizer is None and not opened.model.training
            torch.testing.assert_close(opened(ids), expected, rtol=0, atol=0)
    with pytest.raises(ConfigError, match=r"^tokens='hello': .* has no tokenizer: pass token ids \(B, T\)$"):
        opened.to_tokens("hello")


def test_an_architecture_preset_is_built_with_random_weights_from_seed_0():
    first, second = headcount.load_model("tiny"), headcount.load_model("tiny")
    assert first.model.cfg.d_model == 32 and first.tokenizer is None
    for a, b in zip(first.model.parameters(), second.model.parameters()):
        assert torch.equal(a, b)


def test_a_pretrained_preset_and_its_source_are_the_same_model():
    pytest.importorskip("transformers")
    preset, source = headcount.load_model("tiny_random_llama"), headcount.load_model("headcount:tiny-random-llama")
    assert preset.tokenizer is not None and preset.model.cfg.attn.n_kv_heads == 2
    ids = preset.to_tokens("abc")
    assert ids.tolist() == [[97, 98, 99]]  # the byte-level tokenizer
    with torch.no_grad():
        assert torch.equal(preset(ids), source(ids))


def test_a_source_that_is_nothing_is_one_line(tmp_path):
    with pytest.raises(ConfigError, match=r"^model.pretrained='.*nowhere': no such folder or .gguf file"):
        headcount.load_model(str(tmp_path / "nowhere"))
