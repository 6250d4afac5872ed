"""The tiny encoder-decoder and the source/target pairs the encoder-decoder scan tests share."""

import torch

from headcount.config.model import AttentionConfig, ModelConfig
from headcount.model.encoder_decoder import EncoderDecoder
from headcount.model.seq2seq import seq2seq_batch


def tiny_seq2seq(dtype: torch.dtype, seed: int = 0, n_ctx: int = 12, vocab_size: int = 30) -> EncoderDecoder:
    """2 encoder layers of 3 heads, 2 decoder layers of 3 heads and 2 cross-attention heads each (a narrower kind, so
    the grid's rows differ in width), every weight, norm and bias random."""
    cfg = ModelConfig(
        n_layers=2, encoder_layers=2, d_model=24, n_ctx=n_ctx, vocab_size=vocab_size, mlp=True,
        attn=AttentionConfig(n_heads=3), cross_attn=AttentionConfig(n_heads=2, head_dim=5),
    )  # fmt: skip
    return randomised(cfg, dtype, seed)


def randomised(cfg: ModelConfig, dtype: torch.dtype, seed: int = 0) -> EncoderDecoder:
    """The encoder-decoder cfg describes, every weight, norm and bias moved off its initial value at random (so no
    invariant holds by a zero or a one)."""
    torch.manual_seed(seed)
    model = EncoderDecoder(cfg).to(dtype).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.3 * torch.randn_like(p))
    return model


def pairs(n: int = 7, seed: int = 1) -> dict:
    """n source/target pairs of different lengths, right-padded (sources 2-6 tokens, targets 1-6)."""
    g = torch.Generator().manual_seed(seed)

    def sentence(shortest: int) -> list[int]:
        return torch.randint(3, 30, (int(torch.randint(shortest, 7, (), generator=g)),), generator=g).tolist()

    sources = [sentence(2) for _ in range(n)]
    targets = [sentence(1) for _ in range(n)]
    batch = seq2seq_batch(sources, targets, start_id=1, pad_id=0)
    return {**batch, "loss_mask": batch["loss_mask"].bool()}


def trained_translation_run(path, steps: int = 6) -> None:
    """A tiny encoder-decoder (2 + 2 layers, 2 heads of each kind) trained `steps` steps on the generated translation
    task (data.source=translation_seq2seq, vocabulary 512) in `path`, as headcount-train runs it."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from omegaconf import OmegaConf

    from headcount.cli.train import run
    from headcount.config import CONF_DIR

    overrides = ["data=translation_seq2seq", "size=smoke", f"trainer.max_steps={steps}",
                 f"trainer.val_check_interval={steps}", "model.encoder_layers=2", "model.n_layers=2",
                 "model.d_model=32", "model.n_ctx=16", "model.vocab_size=512", "model.attn.n_heads=2", "ablation=[]",
                 "ablation.n_eval=24", "ablation.n_reference=16", "ablation.batch_size=16"]  # fmt: skip
    GlobalHydra.instance().clear()
    with initialize_config_dir(CONF_DIR, version_base="1.3"):
        cfg = compose("train", overrides=overrides)
    run(cfg, path)
    (path / ".hydra").mkdir()
    (path / ".hydra" / "config.yaml").write_text(OmegaConf.to_yaml(cfg))  # what Hydra writes for headcount-train
