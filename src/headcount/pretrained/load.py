"""load_pretrained: a checkpoint folder, a .gguf file or a Hub name -> headcount's Transformer, its tokenizer and a
record of where it came from. transformers reads the checkpoint (safetensors, or GGUF dequantised to float32);
headcount converts it (convert.py), checking a folder's or Hub model's config first, so an unsupported model fails
before its weights are downloaded or read.
"""

import io
from collections.abc import Iterator
from contextlib import contextmanager, redirect_stderr
from pathlib import Path
from typing import Any, NamedTuple

import torch

from headcount.config.model import ModelConfig
from headcount.errors import ConfigError
from headcount.model.transformer import Transformer
from headcount.pretrained.checks import KEY
from headcount.pretrained.convert import convert, convert_weights, hf_model_config
from headcount.pretrained.converted_cache import (
    Converted,
    cached_config,
    cached_tokenizer,
    file_sha256,
    load_or_convert,
)
from headcount.pretrained.families import auto_model_class
from headcount.pretrained.gguf_stream import architecture_only, read_gguf
from headcount.pretrained.integrity import check_gguf_file, check_loaded, check_weight_files, first_line, read_errors
from headcount.pretrained.source import Source, hub_errors, locate, require

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")


class Pretrained(NamedTuple):
    model: Transformer  # in eval mode, on the CPU; model.cfg is the ModelConfig the checkpoint implies
    tokenizer: Any  # the checkpoint's transformers tokenizer
    provenance: dict  # plain JSON values: where the weights came from, to record beside results


def pretrained_config(source: str) -> ModelConfig:
    """The ModelConfig a checkpoint implies, read from its config alone (no weights): checks a source early."""
    where = locate(source)
    transformers = require(where)
    if where.kind == "gguf" and (cfg := cached_config(gguf_key(where))) is not None:
        return cfg
    return hf_model_config(_hf_config(transformers, where), where.given)


def load_pretrained(source: str, dtype: torch.dtype = torch.float32, verbose: bool = False) -> Pretrained:
    """Load a GPT-2, Llama-family (Llama, SmolLM, Qwen2) or GPT-NeoX (Pythia) causal LM, or a BERT, RoBERTa,
    DistilBERT or ELECTRA encoder (masked LM or bare), and convert it exactly.

    source: a folder written by transformers' save_pretrained (config.json, safetensors weights, tokenizer), a
    .gguf file (llama.cpp's format; quantised weights are dequantised), or a Hugging Face Hub name (downloaded, or
    read from the Hugging Face cache). dtype: the converted model's; the checkpoint is read in float32 and cast.
    verbose: show transformers' progress bars and warnings while it reads the checkpoint (the commands show them
    with -v); quiet otherwise, as the commands are.
    Bad input raises a one-line ConfigError naming model.pretrained: an unsupported architecture or feature, a
    missing optional package (`pip install 'headcount[pretrained]'`), a Hub name without a network, a weights file
    that is missing or damaged, a tensor missing, left over or of another shape than the config says."""
    where = locate(source)
    transformers = require(where)
    if where.kind == "gguf":  # a file the cache holds was read whole once: no need to check it again
        converted = load_or_convert(gguf_key(where), where.given, lambda: convert_gguf(transformers, where, verbose))
        return Pretrained(converted.model.to(dtype), converted.tokenizer, provenance(where, converted.hf_record, dtype))
    # refuse what cannot be converted before downloading or reading any weights
    hf_config = _hf_config(transformers, where)
    hf_model_config(hf_config, where.given)
    check_weight_files(where)
    name, kwargs = where.from_pretrained_args()
    with hub_errors(where), quiet_loading(verbose):
        with read_errors(where):
            # Mismatched shapes are reported in the loading info rather than raised, so that check_loaded names them
            # with the missing and the left-over tensors.
            hf_model, info = auto_model_class(transformers, hf_config, where.given).from_pretrained(
                name, dtype=torch.float32, output_loading_info=True, ignore_mismatched_sizes=True, **kwargs
            )
        check_loaded(where, info, hf_model)
        tokenizer = _tokenizer(transformers, where)
    record = hf_record(hf_model.config)
    model = convert(hf_model, where.given, release=True).to(dtype)  # hf_model's tensors move into the model
    return Pretrained(model, tokenizer, provenance(where, record, dtype))


def gguf_key(where: Source) -> str:
    """What the converted-weights cache knows a GGUF file by: its sha256."""
    return file_sha256(Path(where.location) / where.gguf_file)


def convert_gguf(transformers: Any, where: Source, verbose: bool) -> Converted:
    """A GGUF file converted tensor by tensor (gguf_stream.py), with its tokenizer: what the cache keeps."""
    reader = check_gguf_file(where)
    architecture = architecture_only(reader)
    hf_config = _hf_config(transformers, where)
    hf_model_config(hf_config, where.given)  # refuse what cannot be converted before de-quantising anything
    with quiet_loading(verbose):
        with read_errors(where):
            weights = read_gguf(
                transformers, where, reader, architecture, hf_config, verbose
            )  # checked; nothing de-quantised yet
        # The tokenizer before the weights: what reading it needs for a while is then not added to their memory.
        tokenizer = _tokenizer(transformers, where)
        with read_errors(where):
            model = convert_weights(hf_config, weights, where.given)
    return Converted(model, tokenizer, hf_record(hf_config))


@contextmanager
def quiet_loading(verbose: bool) -> Iterator[None]:
    """Without verbose: none of transformers' progress bars (reading weights), its warnings (errors still raise), nor
    the plain tqdm bar its GGUF reader draws, which its progress-bar switch does not reach. Each setting is restored
    after, so that quiet loading changes nothing else in the caller's process."""
    if verbose:
        yield
        return
    from transformers.utils import logging as hf_logging

    bars, level = hf_logging.is_progress_bar_enabled(), hf_logging.get_verbosity()
    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    try:
        with redirect_stderr(io.StringIO()):
            yield
    finally:
        if bars:
            hf_logging.enable_progress_bar()
        hf_logging.set_verbosity(level)


def load_tokenizer(source: str):
    """The checkpoint's transformers tokenizer alone (no weights)."""
    where = locate(source)
    transformers = require(where)
    if where.kind == "gguf" and (tokenizer := cached_tokenizer(gguf_key(where))) is not None:
        return tokenizer
    with hub_errors(where):
        return _tokenizer(transformers, where)


def _hf_config(transformers: Any, where: Source) -> Any:
    name, kwargs = where.from_pretrained_args()
    with hub_errors(where):
        try:
            return transformers.AutoConfig.from_pretrained(name, **kwargs)
        except ValueError as err:  # a model type this transformers does not know
            raise ConfigError(KEY, where.given, f"transformers cannot read its config: {first_line(err)}") from None


def _tokenizer(transformers: Any, where: Source) -> Any:
    name, kwargs = where.from_pretrained_args()
    try:
        tokenizer = transformers.AutoTokenizer.from_pretrained(name, **kwargs)
    except (OSError, ValueError, TypeError) as err:
        if where.kind == "hub":
            raise
        why = why_no_tokenizer(where, err)
        raise ConfigError(KEY, where.given, f"has no tokenizer transformers can load: {why}") from None
    # Without tokenizer files transformers builds an empty tokenizer of the config's class rather than failing.
    if not tokenizer.vocab_size:
        raise ConfigError(KEY, where.given, "has no tokenizer (tokenizer.json, or the files its tokenizer class reads)")
    return tokenizer


def why_no_tokenizer(where: Source, err: BaseException) -> str:
    """Why, in one line: for a folder, which files its tokenizer class reads and which it holds (transformers' own
    message, over several lines the first of which ends in a colon, names neither)."""
    said = " ".join(line.strip() for line in str(err).strip().splitlines() if line.strip()) or type(err).__name__
    if where.kind != "folder":
        return said
    folder = Path(where.location)
    name, files = tokenizer_files(folder)
    if present := [file for file in files if (folder / file).is_file()]:
        return f"its tokenizer files in {folder} ({', '.join(present)}) do not read: {said}"
    return (
        f"{folder} holds none of the files its tokenizer ({name}) is read from ({', '.join(files)}); copy them from "
        "where the checkpoint came from, or write them there with the tokenizer's save_pretrained"
    )


def tokenizer_files(folder: Path) -> tuple[str, list[str]]:
    """The tokenizer class transformers would build for a folder (tokenizer_config.json's tokenizer_class, else the
    one of its config's model_type) and the files that class reads."""
    import json

    from transformers.models.auto.tokenization_auto import TOKENIZER_MAPPING_NAMES, tokenizer_class_from_name

    def field(file: str, key: str) -> Any:
        try:
            return json.loads((folder / file).read_text()).get(key)
        except (OSError, ValueError, AttributeError):
            return None

    name = field("tokenizer_config.json", "tokenizer_class") or TOKENIZER_MAPPING_NAMES.get(
        field("config.json", "model_type")
    )
    names = [n for n in (name if isinstance(name, tuple) else (name,)) if n] or ["TokenizersBackend"]
    files: list[str] = []
    for candidate in names:
        kind = tokenizer_class_from_name(candidate) or tokenizer_class_from_name(candidate.removesuffix("Fast"))
        files += [f for f in getattr(kind, "vocab_files_names", {}).values() if f not in files]
    return names[-1], files or ["tokenizer.json"]


def hf_record(hf_config: Any) -> dict:
    """What provenance records of a transformers config."""
    record = {
        "model_type": hf_config.model_type,
        "architectures": list(getattr(hf_config, "architectures", None) or []),
    }
    if revision := getattr(hf_config, "_commit_hash", None):
        record["revision"] = revision
    return record


def provenance(where: Source, hf: dict, dtype: torch.dtype) -> dict:
    """Where the weights came from: the source, its files' sha256 (local sources) or the Hub revision, the
    architecture (hf: hf_record's), and the versions that read it."""
    import transformers

    record = {
        "source": where.given,
        "kind": where.kind,
        "model_type": hf["model_type"],
        "architectures": hf["architectures"],
        "dtype": str(dtype).removeprefix("torch."),
        "transformers": transformers.__version__,
    }
    if where.kind == "hub":
        record["revision"] = hf.get("revision")
        return record
    folder = Path(where.location)
    if where.kind == "gguf":
        files = [folder / where.gguf_file]
    else:
        files = sorted(p for p in folder.iterdir() if p.name == "config.json" or p.name.endswith(WEIGHT_SUFFIXES))
    record["files"] = {p.name: file_sha256(p) for p in files}
    return record
