"""Named components, registered one way: ablation modes, metrics, task sources, scan kinds, data sources, findings
and pretrained families.

Each kind of component has one `Registry`; a component registers itself where it is defined, with
`@REGISTRY.register` on a class or function, or `REGISTRY.register(obj)` for an object, keyed on the component's own
name (`named_by`: `name` unless the registry says otherwise), so adding one never means editing a list elsewhere.
Looking up a name that is not there is a one-line ConfigError naming the config key, the allowed names and the
closest match. `headcount.components` lists every registry from one place (`headcount-ablate --list`).

The registries' names and lines are also kept in `component_index.json` beside this file (written by
`python -m headcount.components`, checked equal to the filled registries by tests/test_components.py): the modules
that define components import torch, and the commands check the names a config uses, and list them, from the index
before any of that is imported (`indexed_kinds`).
"""

import difflib
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Generic, TypeVar

from headcount.errors import ConfigError

T = TypeVar("T")

REGISTRIES: list["Registry"] = []  # every registry, in the order the modules that define them were imported


class Registry(Generic[T]):
    def __init__(self, kind: str, key: str, doc: str, named_by: str = "name"):
        """kind: what one component is ("metric"); key: the config key that names one ("ablation.metric");
        doc: what the kind is for, one line; named_by: the attribute that holds a component's name."""
        self.kind, self.key, self.doc, self.named_by = kind, key, doc, named_by
        self._items: dict[str, T] = {}
        REGISTRIES.append(self)

    def register(self, obj: T) -> T:
        """Decorator: registers obj under its name (the `named_by` attribute, `name` unless the registry says
        otherwise: a class attribute, or a function's own name)."""
        self.add(getattr(obj, self.named_by, None) or obj.__name__, obj)
        return obj

    def add(self, name: str, obj: T) -> None:
        if name in self._items and self._items[name] is not obj:
            raise ValueError(f"two {self.kind}s named {name!r}")
        self._items[name] = obj

    def __contains__(self, name: object) -> bool:
        return name in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __getitem__(self, name: str) -> T:
        return self._items[name]

    def __len__(self) -> int:
        return len(self._items)

    def names(self) -> list[str]:
        """In the order registered (a package's modules import alphabetically)."""
        return list(self._items)

    def get(self, name: str, key: str | None = None) -> T:
        """The component registered as `name`; ConfigError naming `key` (default: the registry's) otherwise."""
        if name in self._items:
            return self._items[name]
        raise ConfigError(key or self.key, name, self.allowed(str(name)))

    def allowed(self, wrong: str = "") -> str:
        return allowed(self.names(), wrong)

    def describe(self) -> list[tuple[str, str]]:
        """(name, what it is in a line) for each component, in the order registered."""
        return [(name, describe(self._items[name])) for name in self.names()]


def describe(obj: object) -> str:
    """A component's line: its `doc`, else its own docstring's first paragraph."""
    doc = getattr(obj, "doc", None) or (vars(obj).get("__doc__") if isinstance(obj, type) else None)
    return " ".join((doc or "").strip().split("\n\n")[0].split())


def allowed(names: list[str], wrong: str = "") -> str:
    """The end of every unknown-name error: the allowed names and the one closest to `wrong`, if any is close."""
    text = f"allowed: {', '.join(names)}"
    close = difflib.get_close_matches(str(wrong), names, n=1)
    return f"{text}; did you mean {close[0]}?" if close else text


INDEX_PATH = Path(__file__).with_name("component_index.json")


@dataclass(frozen=True)
class IndexedKind:
    """One registry as the index holds it: what `--list` prints and what a name is checked against, without the
    components themselves."""

    kind: str
    key: str
    doc: str
    lines: tuple[tuple[str, str], ...]  # (name, what it is in a line), in the order registered

    def names(self) -> list[str]:
        return [name for name, _ in self.lines]

    def describe(self) -> list[tuple[str, str]]:
        return list(self.lines)

    def check(self, name: str, key: str | None = None) -> None:
        """Registry.get's ConfigError, word for word, when `name` is not a registered component."""
        if name not in self.names():
            raise ConfigError(key or self.key, name, allowed(self.names(), str(name)))


def indexed(registry: Registry) -> IndexedKind:
    return IndexedKind(registry.kind, registry.key, registry.doc, tuple(registry.describe()))


def indexed_kinds(path: Path = INDEX_PATH) -> dict[str, IndexedKind]:
    """Every kind in the index, by kind ("ablation mode"), in the order the registries fill."""
    kinds = [
        IndexedKind(k["kind"], k["key"], k["doc"], tuple(map(tuple, k["lines"]))) for k in json.loads(path.read_text())
    ]
    return {k.kind: k for k in kinds}


def index_text(kinds: list[IndexedKind]) -> str:
    """The index file's text: a JSON list of kinds, one line per component (a new one is a one-line diff)."""

    def kind_text(k: IndexedKind) -> str:
        head = json.dumps({"kind": k.kind, "key": k.key, "doc": k.doc}, ensure_ascii=False)[:-1]
        lines = ",\n".join(f"   {json.dumps(list(line), ensure_ascii=False)}" for line in k.lines)
        return f' {head}, "lines": [\n{lines}\n ]}}'

    return "[\n" + ",\n".join(kind_text(k) for k in kinds) + "\n]\n"
