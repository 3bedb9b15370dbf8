"""The layout is the architecture: which package of graphbridge may import which.

bridge/config is the ground floor (the schema, the graph vocabulary, the model facts, the release
table): it imports nothing else of ours, so every layer can read it. The rules judge configurations from
that vocabulary, never from translation or an engine: plan works where megatron-core is not installed.
The memory estimate sits below the rules (its rule reads it), so it reads neither the rules nor
translation; FLOPs, like the estimate, needs only the model's facts.
"""

import ast
from pathlib import Path

import pytest

BRIDGE = Path(__file__).resolve().parents[1] / "bridge"

FLOORS = {
    "config": ("bridge.config",),
    "validation": ("bridge.config", "bridge.validation", "bridge.machine", "bridge.memory"),  # memory: its rule
    "memory": ("bridge.config", "bridge.machine", "bridge.memory"),
    "flops.py": ("bridge.config",),
}
"""A package or module of bridge -> the graphbridge modules it may import (prefixes)."""


def sources(name: str):
    """The Python files of bridge's package or module ``name``."""
    path = BRIDGE / name
    return sorted(path.rglob("*.py")) if path.is_dir() else [path]


def imported_modules(path: Path):
    """(line, module) for every graphbridge module ``path`` imports, at the top or inside a function."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        else:
            continue
        yield from ((node.lineno, name) for name in names if name == "bridge" or name.startswith("bridge."))


def allowed(module: str, prefixes) -> bool:
    return any(module == prefix or module.startswith(prefix + ".") for prefix in prefixes)


@pytest.mark.parametrize("package", sorted(FLOORS))
def test_a_package_imports_only_the_floors_below_it(package):
    strays = [f"{path.relative_to(BRIDGE.parent)}:{line} imports {module}"
              for path in sources(package)
              for line, module in imported_modules(path) if not allowed(module, FLOORS[package])]
    assert not strays, "\n".join(strays)


def test_every_floor_names_code_that_exists():
    assert all(sources(name) and all(path.exists() for path in sources(name)) for name in FLOORS)


def test_the_import_check_sees_imports_inside_functions(tmp_path):
    module = tmp_path / "late.py"
    module.write_text("def build():\n    from bridge.translate import megatron_arguments\n")
    assert list(imported_modules(module)) == [(2, "bridge.translate")]
    assert not allowed("bridge.translate", FLOORS["validation"])
    assert not allowed("bridge.validation.model_facts", FLOORS["memory"])
