"""docs/DESIGN.md's "The code", checked mechanically: imports only point down its listing of rooms, with no cycle
between rooms or between modules, every room is listed, and no folder holds more than a fifth of the code."""

import importlib.util
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "import_graph.py"


@pytest.fixture(scope="module")
def drawing():
    spec = importlib.util.spec_from_file_location("import_graph", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_every_room_is_listed_in_design(drawing):
    rooms, listed = drawing.graph().rooms, set(drawing.layers())
    assert rooms - listed == set(), "rooms DESIGN.md's listing leaves out"
    assert listed - rooms == set(), "rooms DESIGN.md lists that are not in the package"


def test_imports_point_down_the_layers(drawing):
    assert drawing.upward(drawing.graph(), drawing.layers()) == []


def test_no_cycles(drawing):
    assert drawing.graph().cycles() == []
    assert drawing.graph(by_module=True).cycles() == []


def test_no_folder_over_a_fifth_of_the_code(drawing):
    folder, share = drawing.graph().largest_folder()
    assert share <= 0.20, folder


def test_the_drawing_sees_an_upward_import_and_a_cycle(drawing, tmp_path):
    """The checks above can fail: a planted upward arrow and a planted cycle are found."""
    g = drawing.graph()
    g.arrows |= {("config", "cli"), ("cli", "config")}
    assert ("config", "cli") in drawing.upward(g, drawing.layers())
    assert any({"cli", "config"} <= set(group) for group in g.cycles())


def session_attributes(path: Path) -> set[str]:
    """The attributes a module reads of `session` or `self.session`."""
    import ast

    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Attribute):
            owner = node.value
            if (isinstance(owner, ast.Name) and owner.id == "session") or (
                isinstance(owner, ast.Attribute) and owner.attr == "session"
            ):
                found.add(node.attr)
    return found


def test_scans_see_the_session_only_through_scan_context():
    """DESIGN.md: scans (and the structural export) use only what the ScanContext protocol declares."""
    from headcount.ablation.scans.context import DeclaredContext, offered

    declared = offered() | {n for n in vars(DeclaredContext) if not n.startswith("_")}
    package = Path(__file__).resolve().parents[1] / "src" / "headcount" / "ablation"
    readers = [*sorted((package / "scans").glob("*.py")), package / "export.py"]
    used = {f"{path.name}: {name}" for path in readers for name in session_attributes(path) - declared}
    assert used == set()
    assert session_attributes(package / "scans" / "base.py") >= {"address", "world", "settings"}  # the check sees reads
