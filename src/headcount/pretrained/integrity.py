"""A checkpoint's weights checked around transformers' reading of them, so that headcount never converts a model that
is not the checkpoint. Left alone, transformers fills a tensor the checkpoint lacks with random values, drops one the
model has no place for, and fails on one of another shape (or, told to ignore it, fills it with random values too),
with a warning that quiet commands hide or a traceback. Every such checkpoint is one line naming model.pretrained,
the file and what is wrong: for folders, GGUF files and Hub models alike.
"""

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from headcount.errors import ConfigError
from headcount.pretrained.checks import KEY
from headcount.pretrained.source import Source

# What transformers' from_pretrained reads weights from in a save_pretrained folder (sharded: an index and its shards).
WEIGHT_FILES = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
)
SHOWN = 5  # tensor names listed in a message; the rest are counted


def first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


def check_weight_files(where: Source) -> None:
    """Before transformers reads anything: a local folder has a weights file and every safetensors file in it has a
    readable header that covers the file (a file cut short, garbage or a damaged header fail here, by name); a GGUF
    file's header and tensor table read."""
    if where.kind == "gguf":
        check_gguf_file(where)
    if where.kind != "folder":
        return
    folder = Path(where.location)
    if not any((folder / name).is_file() for name in WEIGHT_FILES):
        raise ConfigError(
            KEY, where.given, f"has no weights file ({', '.join(WEIGHT_FILES)}): not a whole save_pretrained folder"
        )
    from safetensors import safe_open

    for path in sorted(folder.glob("*.safetensors")):
        try:
            with safe_open(str(path), "pt"):
                pass
        except Exception as err:  # SafetensorError, or OSError for a file that cannot be read at all
            reason = first_line(err).removeprefix("Error while deserializing header: ")
            raise ConfigError(
                KEY, where.given, f"{path.name} is damaged or not a safetensors file ({reason})"
            ) from None


def check_gguf_file(where: Source) -> Any:
    """The GGUF file's reader, or a ConfigError naming the file when its header or tensor table does not read."""
    from gguf import GGUFReader

    try:
        return GGUFReader(str(Path(where.location) / where.gguf_file))
    except Exception as err:  # the reader raises ValueError, struct.error, IndexError ... for a damaged file
        reason = f"{type(err).__name__}: {first_line(err)}"
        raise ConfigError(KEY, where.given, f"{where.gguf_file} is damaged or not a GGUF file ({reason})") from None


@contextmanager
def read_errors(where: Source) -> Iterator[None]:
    """Whatever else transformers raises reading a local checkpoint's weights, as one line (a Hub name's OSErrors are
    hub_errors', which knows about the network)."""
    try:
        yield
    except ConfigError:
        raise
    except Exception as err:
        if where.kind == "hub" and isinstance(err, OSError):
            raise
        what = where.gguf_file or "its weights"
        raise ConfigError(
            KEY, where.given, f"transformers cannot read {what} ({type(err).__name__}: {first_line(err)})"
        ) from None


def weights_named(where: Source) -> str:
    """The file(s) a message names: the GGUF file, the folder's safetensors files, or the Hub model's weights."""
    if where.kind == "gguf":
        return str(where.gguf_file)
    files = sorted(p.name for p in Path(where.location).glob("*.safetensors")) if where.kind == "folder" else []
    return ", ".join(files) if files else "its weights"


def listing(names: list[str]) -> str:
    shown = ", ".join(names[:SHOWN])
    return shown + (f" and {len(names) - SHOWN} more" if len(names) > SHOWN else "")


def tensors(n: int) -> str:
    return f"{n} tensor{'s' if n != 1 else ''}"


def unread_gguf_tensors(where: Source, hf_model: Any) -> list[str]:
    """The tensors of a GGUF file that transformers' GGUF reader skipped: it keeps only those it can name, so a
    tensor the model has no place for vanishes without the loading info's `unexpected_keys` saying so. The names are
    found as the reader finds them (its name map and its architecture's tensor processor)."""
    import numpy as np
    from gguf import GGUFReader

    try:
        from transformers.modeling_gguf_pytorch_utils import TENSOR_PROCESSORS, TensorProcessor, get_gguf_hf_weights_map
    except ImportError:  # another transformers layout: the loading info's checks still apply
        return []
    reader = GGUFReader(str(Path(where.location) / where.gguf_file))
    architecture = str(bytes(reader.fields["general.architecture"].parts[-1]), "utf-8")
    # No config: the processors then rename without reshaping, which is all this needs
    processor = TENSOR_PROCESSORS.get(architecture, TensorProcessor)(config={})
    mapping = get_gguf_hf_weights_map(hf_model, processor)
    unread = []
    for tensor in reader.tensors:
        named = processor.process(
            weights=np.zeros((1, 1), np.float32), name=tensor.name, tensor_key_mapping=mapping, parsed_parameters={}
        ).name
        if named is not None and named not in mapping:  # None: a processor that stores the tensor itself
            unread.append(tensor.name)
    return unread


def check_loaded(where: Source, info: dict, hf_model: Any, unread: list[str] | None = None) -> None:
    """After transformers read the weights (with output_loading_info and ignore_mismatched_sizes): ConfigError if any
    tensor the model needs was missing, left over or of another shape. unread: a GGUF file's tensors that no name of
    the model takes, where the caller found them already (else they are found here)."""
    missing, unexpected = sorted(info.get("missing_keys") or ()), sorted(info.get("unexpected_keys") or ())
    if where.kind == "gguf":
        unexpected += unread if unread is not None else unread_gguf_tensors(where, hf_model)
    mismatched = sorted(info.get("mismatched_keys") or ())
    errors = [str(e) for e in info.get("error_msgs") or ()]
    if not (missing or unexpected or mismatched or errors):
        return
    files = weights_named(where)
    problems = []
    if missing:
        problems.append(f"{files} lacks {tensors(len(missing))} the model needs: {listing(missing)}")
    if unexpected:
        problems.append(f"{files} holds {tensors(len(unexpected))} the model has no place for: {listing(unexpected)}")
    for name, found, needed in mismatched[:SHOWN]:
        problems.append(f"{files}: {name} has shape {tuple(found)}, the config needs {tuple(needed)}")
    if len(mismatched) > SHOWN:
        problems.append(f"and {len(mismatched) - SHOWN} more tensors of other shapes")
    problems += [first_line(Exception(e)) for e in errors[:1]]
    reason = "; ".join(problems)
    raise ConfigError(KEY, where.given, f"{reason} (not a checkpoint of the model its config describes)")
