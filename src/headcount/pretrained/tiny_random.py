"""`headcount:tiny-random-llama`, a built-in pretrained source for CI-sized runs with no download: a Llama with
grouped-query attention (2 layers x 4 heads, 2 key/value heads, width 64, context 256), random weights from seed 0,
and a byte-level tokenizer (token id = byte value, vocabulary 256). `model=tiny_random_llama` selects it.

It is written once, with transformers' save_pretrained, to <cache>/pretrained/tiny-random-llama-v1 (cache:
$HEADCOUNT_CACHE, else ~/.cache/headcount), then read like any checkpoint folder. The same seed and versions give the
same files; pretrained.json records their sha256.
"""

import os
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch

from headcount.errors import ConfigError
from headcount.io import writable

NAME = "headcount:tiny-random-llama"
FOLDER = "tiny-random-llama-v1"  # bump when the recipe changes
CONFIG = dict(
    vocab_size=256,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
    rms_norm_eps=1e-5,
    tie_word_embeddings=False,
    bos_token_id=None,
    eos_token_id=None,
    pad_token_id=None,
)


def cache_folder(name: str = FOLDER) -> Path:
    return Path(os.environ.get("HEADCOUNT_CACHE") or Path.home() / ".cache" / "headcount") / "pretrained" / name


def tiny_random_llama(folder: Path | None = None) -> Path:
    """The folder of the tiny random Llama, written first if it is not there (atomically: a rename)."""
    return written(Path(folder) if folder is not None else cache_folder(), NAME, save)


def written(folder: Path, name: str, save: Callable[[Path], None]) -> Path:
    """folder, written by save(staged folder) first if it holds no config.json (atomically: a rename)."""
    if (folder / "config.json").is_file():
        return folder
    if not writable(folder.parent):
        raise ConfigError(
            "HEADCOUNT_CACHE",
            os.environ.get("HEADCOUNT_CACHE", "~/.cache/headcount"),
            f"{folder.parent} cannot be written (read-only storage, or a file?), and {name} is written there on first "
            "use; choose another folder",
        )
    folder.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f".{folder.name}.tmp-", dir=folder.parent) as work:
        staged = Path(work) / "model"
        save(staged)
        try:
            os.replace(staged, folder)
        except OSError:  # another process wrote it first
            if not (folder / "config.json").is_file():
                raise
    return folder


def save(folder: Path) -> None:
    import transformers as tf

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = tf.LlamaForCausalLM(tf.LlamaConfig(**CONFIG))
    model.save_pretrained(folder)
    byte_tokenizer().save_pretrained(folder)


def byte_tokenizer():
    """One token per byte, id = the byte's value (GPT-2's byte-to-character map, no merges)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {char: byte for byte, char in byte_characters().items()}
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tokenizer.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer)


def byte_characters() -> dict[int, str]:
    """GPT-2's printable character for each byte value (what a ByteLevel pre-tokenizer emits)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = {b: chr(b) for b in printable}, 0
    for b in range(256):
        if b not in chars:
            chars[b] = chr(256 + extra)
            extra += 1
    return chars
