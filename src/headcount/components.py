"""Every kind of component, listed from one place: scan kinds, ablation modes, metrics, task sources, data sources,
findings, pretrained families and pruning orders. Each registers itself where it is defined (headcount/registry.py);
importing the packages that define them fills the registries. `headcount-train --list` and `headcount-ablate --list`
print them from the index (registry.py's component_index.json), so the commands list them without importing torch;
`python -m headcount.components` writes the index from the filled registries."""

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from headcount.registry import INDEX_PATH, REGISTRIES, IndexedKind, Registry, index_text, indexed, indexed_kinds


def registries() -> list[Registry]:
    """Every registry, filled."""
    import headcount.ablation.engine.metrics  # noqa: F401
    import headcount.ablation.engine.modes  # noqa: F401
    import headcount.ablation.methods.pruning  # noqa: F401
    import headcount.ablation.scans  # noqa: F401
    import headcount.data.splits  # noqa: F401
    import headcount.findings  # noqa: F401
    import headcount.pretrained.families  # noqa: F401
    import headcount.tasks  # noqa: F401

    return list(REGISTRIES)


def index_of_registries() -> str:
    """The index file's text, as the filled registries make it."""
    return index_text([indexed(registry) for registry in registries()])


def print_components(console: Console | None = None, kinds: list[IndexedKind] | None = None) -> None:
    """Every kind and its components, one table each (default: from the index)."""
    console = console or Console()
    for registry in kinds if kinds is not None else list(indexed_kinds().values()):
        table = Table(title=f"{registry.kind}s ({registry.key}): {registry.doc}", title_justify="left", box=None)
        table.add_column("name", style="bold", no_wrap=True)
        table.add_column("what")
        for name, what in registry.describe():
            table.add_row(escape(name), escape(what))
        console.print(table)
        console.print()


def take_list_flag(args: list[str]) -> list[str]:
    """`--list` prints every component and exits; other arguments pass through."""
    if "--list" in args:
        print_components()
        raise SystemExit(0)
    return args


if __name__ == "__main__":  # after adding, renaming or redescribing a component: tests/test_components.py asks for it
    INDEX_PATH.write_text(index_of_registries())
    print(f"wrote {INDEX_PATH}")
