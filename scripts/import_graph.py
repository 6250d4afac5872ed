"""The import drawing of src/headcount by room, checked against the layer order in docs/DESIGN.md ("The code").

A room is a top-level module (`api`, `run_dir`) or a sub-package (`config`, `ablation/engine`); an arrow is one room
importing another (any import, at module level or inside a function). The layers are the indented listing of
DESIGN.md's "The code": one line per layer, lowest first, several rooms on a line share a layer, and a sub-package's
rooms below it (`ablation/engine`) are ordered by the listing too. An arrow is upward when it points to a later line.

    python scripts/import_graph.py          # rooms, arrows, upward arrows, cycles, the largest folder's share
"""

from __future__ import annotations

import ast
import re
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "headcount"
DESIGN = ROOT / "docs" / "DESIGN.md"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def room(module: str, known: dict[str, Path]) -> str:
    """`headcount.ablation.engine.modes` -> `ablation/engine`; `headcount.api` -> `api`; the package -> `headcount`."""
    parts = module.split(".")[1:]
    if not parts:
        return "headcount"
    path = known.get(module)
    is_package = path is not None and path.name == "__init__.py"
    folder = parts if is_package else parts[:-1]
    return "/".join(folder) if folder else parts[0]


def imported(path: Path, module: str, known: dict[str, Path]) -> set[str]:
    """The headcount modules `path` imports (the deepest known module each import names)."""
    is_package = path.name == "__init__.py"
    base = module.split(".") if is_package else module.split(".")[:-1]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            origin = ".".join(base[: len(base) - node.level + 1] + ([node.module] if node.module else []))
            origin = origin if node.level else node.module or ""
            names = [f"{origin}.{a.name}" if f"{origin}.{a.name}" in known else origin for a in node.names]
        else:
            continue
        for name in names:
            while name and name not in known:
                name = name.rpartition(".")[0]
            if name.startswith("headcount"):
                found.add(name)
    return found


@dataclass
class Graph:
    rooms: set[str]
    arrows: set[tuple[str, str]]
    lines: dict[str, int]  # lines of code per room

    def cycles(self) -> list[list[str]]:
        """The strongly connected groups of more than one room (Tarjan)."""
        index: dict[str, int] = {}
        low: dict[str, int] = {}
        stack: list[str] = []
        groups: list[list[str]] = []

        def visit(node: str) -> None:
            index[node] = low[node] = len(index)
            stack.append(node)
            for a, b in sorted(self.arrows):
                if a != node:
                    continue
                if b not in index:
                    visit(b)
                    low[node] = min(low[node], low[b])
                elif b in stack:
                    low[node] = min(low[node], index[b])
            if low[node] == index[node]:
                group = []
                while True:
                    top = stack.pop()
                    group.append(top)
                    if top == node:
                        break
                if len(group) > 1:
                    groups.append(sorted(group))

        for node in sorted(self.rooms):
            if node not in index:
                visit(node)
        return groups

    def largest_folder(self) -> tuple[str, float]:
        """The folder (one directory, its own files only) with the largest share of the package's lines."""
        total = sum(self.lines.values())
        name = max(self.lines, key=self.lines.__getitem__)
        return name, self.lines[name] / total


def graph(by_module: bool = False) -> Graph:
    """The drawing by room; by_module: by module (a package's `__init__` is left out: importing a sibling through it
    is not a dependency of the sibling)."""
    known = modules()
    arrows, lines = set(), {}
    for module, path in known.items():
        here = module if by_module else room(module, known)
        lines[here] = lines.get(here, 0) + len(path.read_text().splitlines())
        for target in imported(path, module, known):
            there = target if by_module else room(target, known)
            if by_module and known[target].name == "__init__.py":
                continue
            if there != here and here != "headcount" and there != "headcount":
                arrows.add((here, there))
    return Graph(set(lines) - {"headcount"}, arrows, {k: v for k, v in lines.items() if k != "headcount"})


def layers(design: Path = DESIGN) -> dict[str, int]:
    """Room -> its line in DESIGN.md's layer listing (lowest first)."""
    text = design.read_text().split("## The code", 1)[1]
    block = re.search(r"\n\n((?:    .*\n|\s*\n)+)", text).group(1)
    order: dict[str, int] = {}
    rooms_on_lines = [re.match(r"    ((?:[\w/]+(?:\.py|/)\s+)+)", line + " ") for line in block.splitlines()]
    for layer, names in enumerate(m.group(1).split() for m in rooms_on_lines if m):
        order |= {name.removesuffix(".py").removesuffix("/"): layer for name in names}
    return order


def upward(g: Graph, order: dict[str, int]) -> list[tuple[str, str]]:
    """The arrows from a room to one listed above it (a room not listed counts as above everything)."""
    top = len(order)
    return sorted((a, b) for a, b in g.arrows if order.get(b, top) > order.get(a, top))


def main() -> int:
    g = graph()
    order = layers()
    unlisted = sorted(r for r in g.rooms if r not in order)
    up = upward(g, order)
    folder, share = g.largest_folder()
    module_cycles = graph(by_module=True).cycles()
    print(
        f"rooms {len(g.rooms)}, arrows {len(g.arrows)}, upward arrows {len(up)}, cycles {len(g.cycles())} "
        f"(between modules: {len(module_cycles)})"
    )
    print(f"largest folder: {folder} ({share:.0%} of {sum(g.lines.values())} lines)")
    for a, b in up:
        print(f"  upward: {a} -> {b}")
    for group in g.cycles() + module_cycles:
        print(f"  cycle: {' <-> '.join(group)}")
    if unlisted:
        print(f"  not in DESIGN.md's listing: {', '.join(unlisted)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
