"""The layering docs/architecture.md describes, read from the code's imports: no import cycles
between the appliance's modules; `domain/` imports nothing above it (only itself, the model base
and the clock); `services/`, `runtime.py` and `storage/` import none of the layers that use
them; nothing outside `storage/` imports the database engine, writes SQL or uses
storage other than through the package's exports (the store, its sessions and their records)."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "appliance"
DOMAIN_MAY_IMPORT = ("appliance.domain", "appliance.model", "appliance.clock")
DRIVERS = ("apsw", "psycopg", "psycopg_pool")
# The layers that call services/, and below them what each lower layer must never import.
SERVICE_USERS = ("appliance.api", "appliance.console", "appliance.portal", "appliance.jobs", "appliance.cli", "appliance.app",
                 "appliance.processes")
LAYERS_ABOVE = {
    "appliance.services": SERVICE_USERS,
    "appliance.runtime": ("appliance.services", *SERVICE_USERS),
    "appliance.storage": ("appliance.runtime", "appliance.services", *SERVICE_USERS),
}


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path) -> set[str]:
    """The modules `path` imports at module level (function-level imports are deferred on purpose)."""
    found = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found |= {f"{node.module}.{alias.name}" for alias in node.names}
    return found


def graph() -> dict[str, set[str]]:
    modules = {module_name(path): path for path in PACKAGE.rglob("*.py")}
    return {name: {m for m in imports_of(path) if m in modules and m != name} for name, path in modules.items()}


def test_no_import_cycles():
    edges = graph()
    state: dict[str, str] = {}
    cycles = []

    def visit(name: str, trail: list[str]) -> None:
        state[name] = "open"
        for target in sorted(edges[name]):
            if state.get(target) == "open":
                cycles.append(trail[trail.index(target):] + [target] if target in trail else [name, target])
            elif target not in state:
                visit(target, [*trail, target])
        state[name] = "done"

    for name in sorted(edges):
        if name not in state:
            visit(name, [name])
    assert cycles == []


def test_domain_imports_nothing_above_it():
    wrong = {name: sorted(m for m in targets if not m.startswith(DOMAIN_MAY_IMPORT))
             for name, targets in graph().items() if name.startswith("appliance.domain")}
    assert {name: targets for name, targets in wrong.items() if targets} == {}


def within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def test_lower_layers_import_nothing_above_them():
    """Not even a function-level import: the layer below would depend on the one that uses it."""
    wrong = []
    for path in PACKAGE.rglob("*.py"):
        name = module_name(path)
        above = next((a for layer, a in LAYERS_ABOVE.items() if within(name, layer)), ())
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [node.module]
            else:
                continue
            wrong += [f"{name} imports {t}" for t in targets if any(within(t, upper) for upper in above)]
    assert sorted(wrong) == []


def test_no_sql_outside_storage():
    statements = ("SELECT ", "INSERT ", "UPDATE ", "DELETE FROM", "PRAGMA ", ".execute(")
    found = sorted(f"{module_name(path)}: {line.strip()[:60]}" for path in PACKAGE.rglob("*.py")
                   if not module_name(path).startswith("appliance.storage")
                   for line in path.read_text().splitlines()
                   if any(s in line for s in statements) and not line.lstrip().startswith("#"))
    assert found == []


def outside_storage() -> list[tuple[str, ast.Module]]:
    return [(module_name(path), ast.parse(path.read_text())) for path in PACKAGE.rglob("*.py")
            if not module_name(path).startswith("appliance.storage")]


def test_only_storage_knows_the_database_engine():
    """Not even a function-level import: services get sessions from the store, never a connection."""
    users = sorted(name for name, tree in outside_storage() for node in ast.walk(tree)
                   if isinstance(node, ast.Import) and any(a.name.split(".")[0] in DRIVERS for a in node.names)
                   or isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in DRIVERS)
    assert users == []


def test_the_rest_uses_storage_only_through_its_seam():
    """`from appliance.storage import ...` of what the package exports, never a storage module,
    and never the engine under the store (`store.sqlite`, `store.postgres`)."""
    import appliance.storage as seam

    wrong = []
    for name, tree in outside_storage():
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("appliance.storage"):
                if node.module != "appliance.storage":
                    wrong.append(f"{name} imports {node.module}")
                wrong += [f"{name} imports {a.name}" for a in node.names if a.name not in seam.__all__]
            elif isinstance(node, ast.Import):
                wrong += [f"{name} imports {a.name}" for a in node.names if a.name.startswith("appliance.storage.")]
            elif isinstance(node, ast.Attribute) and node.attr in ("sqlite", "postgres"):
                wrong.append(f"{name} reaches store.{node.attr} (line {node.lineno})")
    assert wrong == []
