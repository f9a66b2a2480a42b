"""The layers of streamkit, read from the code's own imports: who may import whom.

Every module of ``streamkit/``, ``processors/`` and ``testing/`` is parsed;
imports guarded by ``TYPE_CHECKING`` count too (a cycle that only the type
checker sees is still a knot in the design). The rules are the layering of
docs/internals.md, from the bottom up:

- the base modules (errors, events, contract, processor, live_state,
  protocols, checkpoint, shared_map, the JSON helpers) import only each other;
- ``log/`` imports only the base; ``backends/`` the base and ``log/``;
- ``engine/`` and ``control/`` import only the base;
- ``host/`` never imports ``cli/``; nothing below the CLI imports it;
- a core module reaches another package through its face (``streamkit.log``,
  never ``streamkit.log._follow``), as first-party processors and
  ``streamkit.testing`` must too, using only public modules (no ``_private``
  one outside their own package) and never a backend;
- no class is assembled from halves: none declares attributes it never
  assigns (another class's, named for the type checker) nor method stubs
  under ``TYPE_CHECKING`` (see docs/internals.md, "Parts, not halves");
- no import cycles, no function-local imports but those of optional extras,
  no string imports but where a user names the class to load.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from support import ROOT

PACKAGES = (
    ("streamkit", "streamkit"),
    ("processors", "streamkit.processors"),
    ("testing", "streamkit.testing"),
)

BASE = {
    "streamkit.errors",
    "streamkit.events",
    "streamkit.contract",
    "streamkit.catalog",
    "streamkit.lifting",
    "streamkit.schema_check",
    "streamkit.upcasting",
    "streamkit.processor",
    "streamkit.live_state",
    "streamkit.protocols",
    "streamkit.records",
    "streamkit._requests",
    "streamkit._targets",
    "streamkit._timestamps",
    "streamkit._version",
    "streamkit.skips",
    "streamkit.checkpoint",
    "streamkit.horizon",
    "streamkit.holds",
    "streamkit.key_window",
    "streamkit.history",
    "streamkit._json",
    "streamkit._json_size",
    "streamkit._json_canonical",
    "streamkit._event_builders",
    "streamkit._speed",
    "streamkit._json_diff",
    "streamkit._json_walk",
    "streamkit.shared_map",
    "streamkit.tracebacks",
    "streamkit.failure_policy",
}

# layer -> the layers it may import (besides itself); a module's layer is its first
# package under streamkit (``streamkit.host._runner`` -> ``host``), or ``base``.
MAY_IMPORT = {
    "base": set(),
    "log": {"base"},
    "backends": {"base", "log"},
    "engine": {"base"},
    "control": {"base"},
    "config": {"base", "control"},
    "host": {"base", "log", "backends", "engine", "control", "config"},
    "web": {"base", "log", "control", "config", "host"},
    "cli": {"base", "log", "backends", "engine", "control", "config", "host", "face", "web"},
    "face": {"base", "log", "backends", "engine", "control", "config", "host"},
}

# Function-local imports allowed, each for an optional extra that a plain install lacks
# (a package of streamkit's own is named to its third part: the backend that needs it).
LOCAL_IMPORTS_ALLOWED = {
    ("streamkit.processors.notifications.channels", "httpx"),
    ("streamkit.processors.schedules._timing", "cronsim"),  # the schedules extra
    ("streamkit.backends", "streamkit.backends.postgres"),  # psycopg: the postgres extra
    # starlette, uvicorn, prometheus-client: the web extra (the package and its name)
    ("streamkit.cli._host_commands", "streamkit.web"),
    ("streamkit.cli._host_commands", "streamkit.web.HttpService"),
}
# String imports allowed, each where the user names what to load.
STRING_IMPORTS_ALLOWED = {
    "streamkit.config._processors",  # processor classes named in streamkit.toml or --processor
    "streamkit.processors._handlers",  # task and replay handlers named by "module:attr"
    "streamkit.processors.schedules._processor",  # the contracts its emits names "module:NAME"
}


@dataclass
class Module:
    name: str
    path: Path
    imports: set[str] = field(default_factory=set)
    local_imports: set[str] = field(default_factory=set)
    string_imports: int = 0


def _modules() -> Iterator[Module]:
    for folder, dotted in PACKAGES:
        for path in sorted((ROOT / folder).rglob("*.py")):
            rel = path.relative_to(ROOT / folder).with_suffix("")
            parts = [p for p in rel.parts if p != "__init__"]
            yield _read(Module(".".join([dotted, *parts]), path))


def _read(module: Module) -> Module:
    tree = ast.parse(module.path.read_text(encoding="utf-8"))
    local: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            local |= {id(n) for n in ast.walk(node) if isinstance(n, ast.Import | ast.ImportFrom)}
        if isinstance(node, ast.Call):
            called = ast.unparse(node.func)
            if called.endswith(("import_module", "__import__")):
                module.string_imports += 1
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
            names += [f"{node.module}.{alias.name}" for alias in node.names]
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        for name in names:
            if id(node) in local:
                module.local_imports.add(name)
            module.imports.add(name)
    return module


MODULES = {m.name: m for m in _modules()}


def _resolve(name: str) -> str | None:
    """The module an imported name refers to (``from a import b`` may name module a.b)."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _deps(module: Module) -> set[str]:
    return {r for name in module.imports if (r := _resolve(name)) and r != module.name}


def _layer(name: str) -> str:
    if name in {"streamkit", "streamkit.__main__"}:
        return "face" if name == "streamkit" else "cli"
    if name in BASE:
        return "base"
    parts = name.split(".")
    if parts[1] in {"processors", "testing"}:
        return parts[1]
    return parts[1] if parts[1] in MAY_IMPORT else "unplaced"


def _core() -> list[str]:
    return sorted(n for n in MODULES if _layer(n) not in {"processors", "testing"})


def test_every_core_module_has_a_layer() -> None:
    """Each module of streamkit/ sits in a named layer (a new one must be placed here first)."""
    assert [n for n in _core() if _layer(n) == "unplaced"] == []


@pytest.mark.parametrize("name", _core())
def test_a_layer_imports_only_the_layers_below_it(name: str) -> None:
    """No import runs back up: events never reach the log, the log never the host, and so on."""
    layer = _layer(name)
    allowed = MAY_IMPORT[layer] | {layer}
    wrong = sorted(d for d in _deps(MODULES[name]) if _layer(d) not in allowed)
    assert wrong == [], f"{name} ({layer}) imports {wrong}"


def test_a_backend_package_is_imported_only_through_open_log() -> None:
    """Above the backends, a layer opens storage by target, never by naming a backend's modules."""
    found = {
        (name, dep)
        for name, module in MODULES.items()
        if _layer(name) not in {"backends", "processors", "testing", "face"}
        for dep in _deps(module)
        if dep.startswith("streamkit.backends.")
    }
    assert found == set()


@pytest.mark.parametrize(
    "name", sorted(n for n in MODULES if _layer(n) in {"processors", "testing"})
)
def test_processors_and_testing_use_only_public_modules(name: str) -> None:
    """First-party processors and streamkit.testing import what any user may: public modules only."""
    own = ".".join(name.split(".")[:3])
    wrong = []
    for dep in _deps(MODULES[name]):
        if dep.startswith(own):
            continue
        private = any(part.startswith("_") for part in dep.split(".")[1:])
        if (private and not dep.startswith("streamkit.processors._")) or dep.startswith(
            "streamkit.backends"
        ):
            wrong.append(dep)
    assert sorted(wrong) == [], f"{name} imports {sorted(wrong)}"


@pytest.mark.parametrize("name", _core())
def test_a_core_module_reaches_another_package_through_its_face(name: str) -> None:
    """``streamkit.log`` from the host, never ``streamkit.log._log``: a package's face is its API."""
    package = _package(name)
    wrong = sorted(
        dep
        for dep in _deps(MODULES[name])
        if _package(dep) not in {package, None}
        and any(part.startswith("_") for part in dep.split(".")[2:])
    )
    assert wrong == [], f"{name} imports private modules of other packages: {wrong}"


def _package(name: str) -> str | None:
    """The subpackage of streamkit a module belongs to (``streamkit.log._log`` -> ``log``)."""
    parts = name.split(".")
    if len(parts) < 2 or parts[1] in {"processors", "testing"}:
        return None
    if len(parts) == 2 and MODULES[name].path.name != "__init__.py":
        return None  # a base module of the top package
    return parts[1]


# Classes whose bare annotations are fields by their base's own rule (and the classes of
# the same module derived from them).
_FIELD_BASES = ("Protocol", "NamedTuple", "TypedDict", "BaseModel")
# Declared for subclasses to set: each processor class names its contract.
_DECLARED_FOR_SUBCLASSES = {"streamkit.processor.StreamProcessor.contract"}


def _halves() -> Iterator[str]:
    for name, module in MODULES.items():
        tree = ast.parse(module.path.read_text(encoding="utf-8"))
        field_classes: set[str] = set()
        for node in ast.walk(tree):
            if not isinstance(node, ast.ClassDef):
                continue
            bases = [ast.unparse(b) for b in node.bases]
            decorators = [ast.unparse(d) for d in node.decorator_list]
            if any(
                field in base for base in bases for field in (*_FIELD_BASES, *field_classes)
            ) or any("dataclass" in d for d in decorators):
                field_classes.add(node.name)
                continue
            assigned = {
                target.attr
                for item in ast.walk(node)
                if isinstance(item, ast.Assign | ast.AnnAssign | ast.AugAssign)
                for target in (item.targets if isinstance(item, ast.Assign) else [item.target])
                for target in ast.walk(target)
                if isinstance(target, ast.Attribute)
                and isinstance(target.value, ast.Name)
                and target.value.id in {"self", "cls"}
            }
            for item in node.body:
                if isinstance(item, ast.If) and "TYPE_CHECKING" in ast.unparse(item.test):
                    yield f"{name}.{node.name}: method stubs under TYPE_CHECKING"
                if (
                    isinstance(item, ast.AnnAssign)
                    and item.value is None
                    and isinstance(item.target, ast.Name)
                    and item.target.id not in assigned
                    and not _class_var(item)
                    and f"{name}.{node.name}.{item.target.id}" not in _DECLARED_FOR_SUBCLASSES
                ):
                    yield f"{name}.{node.name}.{item.target.id}: declared, never assigned here"


def _class_var(item: ast.AnnAssign) -> bool:
    return "ClassVar" in ast.unparse(item.annotation)


def test_no_class_is_assembled_from_halves() -> None:
    """A class owns the attributes it declares: no mixin re-declares another class's fields."""
    found = sorted(_halves())
    assert found == [], "\n".join(found)


def test_there_are_no_import_cycles() -> None:
    """The module graph is acyclic, type-checking imports included."""
    graph = {name: _deps(module) for name, module in MODULES.items()}
    # A package's face importing its own modules is not a cycle of design: drop face -> child.
    for name, deps in graph.items():
        graph[name] = {d for d in deps if not d.startswith(name + ".")}
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for dep in sorted(graph[node]):
            if state.get(dep) == 1:
                raise AssertionError(
                    "import cycle: " + " -> ".join([*stack[stack.index(dep) :], dep])
                )
            if dep not in state:
                visit(dep)
        stack.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node)


def test_function_local_imports_are_only_for_optional_extras() -> None:
    """Imports sit at the top of a module, where the layering can see them."""
    found = {
        (name, ".".join(imported.split(".")[: 3 if imported.startswith("streamkit.") else 1]))
        for name, module in MODULES.items()
        for imported in module.local_imports
    }
    assert found - LOCAL_IMPORTS_ALLOWED == set()


def test_string_imports_are_only_where_a_user_names_the_class() -> None:
    """importlib loads only what configuration names, never a part of streamkit."""
    assert {n for n, m in MODULES.items() if m.string_imports} <= STRING_IMPORTS_ALLOWED


@pytest.mark.parametrize("layer", ["log", "engine", "host", "control", "cli"])
def test_no_layer_but_the_backends_imports_a_storage_driver(layer: str) -> None:
    """sqlite3 (and later psycopg) is imported only under streamkit/backends/."""
    wrong = sorted(
        name
        for name, module in MODULES.items()
        if _layer(name) == layer
        and {"sqlite3", "psycopg"} & {i.split(".")[0] for i in module.imports}
    )
    assert wrong == []
