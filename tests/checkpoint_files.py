"""The tiny random Llama's weights as a user may hold them, written with no download: a save_pretrained folder, a
GGUF file (llama.cpp's layout, float32) and an entry of the Hugging Face Hub cache, whole or with tensors edited
(one removed, one added, one of another shape) the way a damaged or mismatched checkpoint would be."""

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from headcount.pretrained.tiny_random import byte_characters, tiny_random_llama

Edit = Callable[[dict[str, torch.Tensor]], None]  # changes a state dict in place

O_PROJ = "model.layers.1.self_attn.o_proj.weight"


def drop_o_proj(tensors: dict[str, torch.Tensor]) -> None:
    del tensors[O_PROJ]


def add_extra(tensors: dict[str, torch.Tensor]) -> None:
    tensors["model.layers.1.self_attn.extra.weight"] = tensors[O_PROJ].clone()


def narrow_o_proj(tensors: dict[str, torch.Tensor]) -> None:
    tensors[O_PROJ] = tensors[O_PROJ][:, :32].clone()


def edited_state(edit: Edit | None) -> tuple[dict, dict[str, torch.Tensor]]:
    """The tiny random Llama's config and tensors, edited."""
    folder = tiny_random_llama()
    tensors = load_file(folder / "model.safetensors")
    if edit is not None:
        edit(tensors)
    return json.loads((folder / "config.json").read_text()), tensors


def folder_checkpoint(folder: Path, edit: Edit | None = None) -> Path:
    """A copy of the tiny random Llama's save_pretrained folder, its safetensors file edited."""
    shutil.copytree(tiny_random_llama(), folder)
    _, tensors = edited_state(edit)
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    return folder


def hub_checkpoint(cache: Path, repo: str, edit: Edit | None = None) -> str:
    """The edited folder as the Hugging Face cache holds a downloaded `repo` (offline, it is read from there)."""
    entry = cache / f"models--{repo.replace('/', '--')}"
    revision = "0" * 40
    folder_checkpoint(entry / "snapshots" / revision, edit)
    (entry / "refs").mkdir(parents=True)
    (entry / "refs" / "main").write_text(revision)
    return repo


def permuted(weight: torch.Tensor, n_heads: int) -> torch.Tensor:
    """llama.cpp's row order for q and k (transformers' GGUF reader undoes it)."""
    return (
        weight.reshape(n_heads, 2, weight.shape[0] // n_heads // 2, *weight.shape[1:])
        .swapaxes(1, 2)
        .reshape(weight.shape)
    )


GGUF_NAMES = {
    "input_layernorm": "attn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "post_attention_layernorm": "ffn_norm",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}
GGUF_TOP = {"model.embed_tokens": "token_embd", "model.norm": "output_norm", "lm_head": "output"}


def gguf_name(name: str) -> str:
    module = name.removesuffix(".weight")
    if module in GGUF_TOP:
        return GGUF_TOP[module] + ".weight"
    _, _, layer, rest = module.split(".", 3)
    return f"blk.{layer}.{GGUF_NAMES.get(rest, rest)}.weight"


def gguf_checkpoint(path: Path, edit: Edit | None = None, quantised: bool = False) -> Path:
    """The tiny random Llama as a float32 GGUF file with its byte-level tokenizer: transformers reads it back as the
    same model as the folder. quantised: its matrices in llama.cpp's 8-bit blocks (Q8_0), as real GGUF files hold
    them (read back, they differ from the folder's by the rounding)."""
    import gguf

    config, tensors = edited_state(edit)
    n_heads, n_kv = config["num_attention_heads"], config["num_key_value_heads"]
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name("tiny-random-llama")
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(n_heads)
    writer.add_head_count_kv(n_kv)
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    writer.add_rope_freq_base(10000.0)
    writer.add_rope_dimension_count(config["hidden_size"] // n_heads)
    writer.add_vocab_size(config["vocab_size"])
    chars = byte_characters()
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list([chars[b] for b in range(256)])
    writer.add_token_types([1] * 256)
    writer.add_token_scores([0.0] * 256)
    for name, tensor in tensors.items():
        tensor = tensor.float()
        if name.endswith(("q_proj.weight", "k_proj.weight")):
            tensor = permuted(tensor, n_heads if "q_proj" in name else n_kv)
        if quantised and tensor.ndim == 2:
            kind = gguf.GGMLQuantizationType.Q8_0
            writer.add_tensor(gguf_name(name), gguf.quants.quantize(tensor.numpy(), kind), raw_dtype=kind)
        else:
            writer.add_tensor(gguf_name(name), tensor.numpy())
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
