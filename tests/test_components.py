"""docs/DESIGN.md's "Components, registered one way", checked mechanically: every kind of component has one registry,
its components register themselves where they are defined, an unknown name is one line with the allowed names and
the closest match, and no other code or text in the package lists a kind's components."""

import ast
import re
import sys
from pathlib import Path

import pytest

import headcount
from headcount.components import registries
from headcount.errors import ConfigError

PACKAGE = Path(headcount.__file__).parent
CONF = PACKAGE.parents[1] / "conf"
# The lists kept beside a registry, on purpose: the Choice enums of data.source (and its synthetic subset) in
# config/data.py and of the pruning orders in config/ablation.py, so that Hydra refuses a bad value when it composes,
# before the layers that define them are imported; the tests at the end check that each agrees with its registry.
KEPT_LISTS = {("config/data.py", "data source"), ("config/ablation.py", "pruning order")}


def registry_names() -> dict[str, set[str]]:
    """Each kind's component names, less those short enough to be ordinary words (loss, copy, text, gpt2)."""
    return {r.kind: {n for n in r.names() if len(n) > 4 or "_" in n} for r in registries()}


def lists_at(registry_kind: str) -> int:
    """A text names a kind's components as a list when it names two thirds of them (and at least 3); fewer is a text
    about some of them (a finding that compares two pruning orders)."""
    total = len(next(r for r in registries() if r.kind == registry_kind))
    return max(3, -(-2 * total // 3))


def defining_modules() -> dict[str, set[str]]:
    """Per kind, the modules (relative paths) that register its components: they may name what they define."""
    modules: dict[str, set[str]] = {}
    for registry in registries():
        for name in registry.names():
            component = registry[name]
            module = (
                component.check.__module__
                if hasattr(component, "reads")
                else getattr(component, "__module__", type(component).__module__)
            )
            path = Path(__import__(module, fromlist=["_"]).__file__).relative_to(PACKAGE)
            modules.setdefault(registry.kind, set()).add(str(path))
    return modules


def defined_in(component) -> str:
    """The module a component is defined in: a class's or function's own, else that of its first function (a
    finding's checker, a data source's generator or builder, a family's config translation)."""
    if isinstance(component, type) or callable(component):
        return component.__module__
    functions = [value for value in component if callable(value)]  # the NamedTuple and dataclass components
    return functions[0].__module__


# Pretrained families are registered in pretrained/families.py, one line each, from the family modules' two
# functions (gpt2.py, llama.py, gpt_neox.py hold plain functions and import nothing of the registry).
REGISTERED_ELSEWHERE = {"pretrained family": "headcount.pretrained.families"}


def test_every_kind_has_one_registry_and_components_register_where_defined():
    kinds = [r.kind for r in registries()]
    assert len(kinds) == len(set(kinds))
    for registry in registries():
        variable = registry_name(registry)
        for name in registry.names():
            component = registry[name]
            module = REGISTERED_ELSEWHERE.get(registry.kind) or defined_in(component)
            source = Path(__import__(module, fromlist=["_"]).__file__).read_text()
            assert re.search(rf"{variable}\.register\b", source), (registry.kind, name, module)
            assert f"{variable}.add(" not in source  # one style: register, keyed on the component's own name


def registry_name(registry) -> str:
    """The registry's variable name, from the module that defines it."""
    for module in list(sys.modules.values()):
        for attribute, value in list(vars(module).items()) if module else []:
            if value is registry and attribute.isupper():
                return attribute
    raise AssertionError(registry.kind)


@pytest.mark.parametrize("registry", registries(), ids=lambda r: r.kind)
def test_an_unknown_name_is_one_line_with_the_closest_match(registry):
    name = registry.names()[0]
    with pytest.raises(ConfigError) as error:
        registry.get(name + "x")
    message = str(error.value)
    assert "\n" not in message and registry.key in message and f"did you mean {name}?" in message


def listed(text: str, names: set[str]) -> set[str]:
    return {n for n in names if re.search(rf"(?<![\w.\-/=]){re.escape(n)}(?![\w\-/])", text)}


def texts(tree: ast.AST):
    """(line, text) of every string, every literal collection of strings and every class body of string constants
    (an enum) in a module."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            yield node.lineno, node.value
        elif isinstance(node, ast.Tuple | ast.List | ast.Set):
            yield (
                node.lineno,
                " ".join(e.value for e in node.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)),
            )
        elif isinstance(node, ast.ClassDef):
            values = [
                s.value.value for s in node.body if isinstance(s, ast.Assign) and isinstance(s.value, ast.Constant)
            ]
            yield node.lineno, " ".join(v for v in values if isinstance(v, str))


def lists_in(text: str, kinds: dict[str, set[str]]) -> list[tuple[str, list[str]]]:
    return [(kind, sorted(hits)) for kind, names in kinds.items() if len(hits := listed(text, names)) >= lists_at(kind)]


def test_nothing_else_lists_the_components():
    """No string, docstring, literal or enum of the package, and no comment of conf/, names two thirds or more of a
    kind's components, outside the modules that define them (and the lists kept on purpose)."""
    kinds, defining = registry_names(), defining_modules()
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        where = str(path.relative_to(PACKAGE))
        for line, text in texts(ast.parse(path.read_text())):
            for kind, hits in lists_in(text, kinds):
                if where not in defining.get(kind, set()) and (where, kind) not in KEPT_LISTS:
                    found.append(f"{where}:{line} lists {kind}s {hits}")
    for path in sorted(CONF.rglob("*.yaml")):
        for line, text in enumerate(path.read_text().splitlines(), 1):
            found += [
                f"conf/{path.relative_to(CONF)}:{line} lists {kind}s {hits}" for kind, hits in lists_in(text, kinds)
            ]
    assert found == []


MODE_LIST_SPAN = 40  # characters: mode names this close together are a list, not prose about modes


def modes_listed(text: str, names: list[str]) -> list[str]:
    """The mode names (short ones too: zero and mean are ordinary words, but not four of them in a row) that a text
    names within MODE_LIST_SPAN characters of each other, when they are at least lists_at("ablation mode")."""
    found = sorted((m.start(), name) for name in names for m in re.finditer(rf"\b{name}\b", text))
    for i, (start, _) in enumerate(found):
        near = {name for at, name in found[i:] if at - start <= MODE_LIST_SPAN}
        if len(near) >= lists_at("ablation mode"):
            return sorted(near)
    return []


def test_nothing_else_lists_the_modes():
    """config/ablation.py, api.py, methods/attribution.py and methods/importance.py listed the modes ("zero, mean,
    resample or patch"), which the check above, counting names longer than 4 characters, could not see. A comment
    counts too."""
    import io
    import tokenize

    from headcount.ablation.engine.modes import MODES

    names, defining = MODES.names(), defining_modules()["ablation mode"]
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        where, source = str(path.relative_to(PACKAGE)), path.read_text()
        comments = [
            (token.start[0], token.string)
            for token in tokenize.generate_tokens(io.StringIO(source).readline)
            if token.type == tokenize.COMMENT
        ]
        for line, text in [*texts(ast.parse(source)), *comments]:
            if where not in defining and (hits := modes_listed(text, names)):
                found.append(f"{where}:{line} lists modes {hits}")
    assert found == []
    assert modes_listed("mode: zero, mean, resample or patch", names) and modes_listed("zero, resample or patch", names)
    assert not modes_listed("patch and resample run the model on each example's source", names)


def test_the_listing_check_finds_a_list():
    """The check above can fail: a docstring naming the scan kinds is a list."""
    kinds = registry_names()
    text = "scans: " + ", ".join(sorted(kinds["scan kind"]))
    assert [kind for kind, _ in lists_in(text, kinds)] == ["scan kind"]


def test_data_sources_enum_is_the_registry():
    from headcount.config.data import SYNTHETIC_SOURCES, Source
    from headcount.data.sources import DATA_SOURCES, synthetic_sources

    assert sorted(s.value for s in Source) == sorted(DATA_SOURCES.names())
    assert list(SYNTHETIC_SOURCES) == synthetic_sources()


def test_pruning_order_enums_are_the_registry():
    from headcount.ablation.methods.pruning import PRUNING_ORDERS
    from headcount.config.ablation import DEFAULT_ORDERS, ExportOrder, PruningOrder

    assert [o.value for o in PruningOrder] == PRUNING_ORDERS.names()
    assert [o.value for o in ExportOrder] == [*PRUNING_ORDERS.names(), "l0_gates"]
    assert set(DEFAULT_ORDERS) <= set(PRUNING_ORDERS.names())


def test_no_code_compares_a_modes_or_metrics_name():
    """DESIGN.md: behaviour that differs by mode or metric lives on the object. No comparison in the package has a
    mode's or a metric's name on one side, except in the result address, whose names are made of them."""
    names = {name for r in registries() if r.kind in ("ablation mode", "metric") for name in r.names()}
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name == "address.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Compare):
                sides = [node.left, *node.comparators]
                strings = {s.value for s in sides if isinstance(s, ast.Constant) and isinstance(s.value, str)}
                for side in sides:  # ("zero", "mean") on either side of `in`
                    if isinstance(side, ast.Tuple | ast.List | ast.Set):
                        strings |= {e.value for e in side.elts if isinstance(e, ast.Constant)}
                if strings & names:
                    found.append(f"{path.relative_to(PACKAGE)}:{node.lineno} compares {sorted(strings & names)}")
    assert found == []


def test_the_index_is_the_registries():
    """registry.py's component_index.json, which the commands check names against and list before torch loads, is
    what the filled registries make, in a fresh process as `python -m headcount.components` makes it (a test that
    imported one component's module first would register it, and list it, first)."""
    import subprocess

    from headcount.registry import INDEX_PATH

    code = "from headcount.components import index_of_registries; print(index_of_registries(), end='')"
    made = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert INDEX_PATH.read_text() == made, "stale: `python -m headcount.components` rewrites it"


@pytest.mark.parametrize("registry", registries(), ids=lambda r: r.kind)
def test_an_indexed_name_is_checked_with_the_registrys_line(registry):
    from headcount.registry import indexed_kinds

    kind = indexed_kinds()[registry.kind]
    for name in registry.names():
        kind.check(name)  # every registered name passes
    for wrong in (registry.names()[0] + "x", "nosuch"):
        with pytest.raises(ConfigError) as indexed:
            kind.check(wrong)
        with pytest.raises(ConfigError) as live:
            registry.get(wrong)
        assert str(indexed.value) == str(live.value)


def full_check_line(cfg, key: str) -> str:
    """The line the checks after torch loads give for cfg's name under `key`."""
    from headcount.ablation.checks import validate_settings
    from headcount.ablation.session import typed_ablation
    from headcount.config import typed
    from headcount.config.task import TaskConfig
    from headcount.findings import validate_finding
    from headcount.tasks import SOURCES, validate_task_config

    with pytest.raises(ConfigError) as error:
        if key == "finding":
            validate_finding(cfg.finding)
        elif key == "task.source":
            validate_task_config(typed(cfg.task, TaskConfig), list(SOURCES))
        else:
            validate_settings(typed_ablation(cfg.ablation), None)
    return str(error.value)


@pytest.mark.parametrize(
    "override",
    [
        "ablation.mode=zro",
        "ablation.metric=logit_dif",
        "ablation.scans.single_head.kind=single_heads",
        "task=ioi task.source=ioj",
        "finding=induction_head",
    ],
)
def test_a_config_names_check_says_what_the_full_checks_say(compose_train, override):
    """config/names.py, run by the commands before torch loads, refuses each misspelt name with the same line as
    the checks that follow it (and passes the config as composed without the mistake)."""
    from headcount.config.names import check_component_names

    check_component_names(compose_train(["task=ioi"] if "task" in override else []))
    cfg = compose_train(override.split())
    with pytest.raises(ConfigError) as early:
        check_component_names(cfg)
    key = override.split()[-1].split("=")[0]
    assert f"{key}=" in str(early.value)
    assert str(early.value) == full_check_line(cfg, key)


def test_a_config_names_check_passes_settings_for_a_scan_left_out(compose_train):
    """An experiment's settings for a scan that `ablation=[...]` left out have no kind: not a name to check."""
    from headcount.config.names import check_component_names

    cfg = compose_train(["experiment=ioi_heads", "size=smoke", "ablation=[baseline]"])
    assert any(scan.get("kind") is None for scan in cfg.ablation.scans.values())
    check_component_names(cfg)
