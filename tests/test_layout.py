"""The layout is the architecture: which package of graphbridge may import which.

bridge/config is the ground floor (the schema, the graph vocabulary, the release table): it imports
nothing else of ours, so every layer can read it. The rules judge configurations from that vocabulary,
never from translation or an engine: plan works where megatron-core is not installed.
"""

import ast
from pathlib import Path

import pytest

BRIDGE = Path(__file__).resolve().parents[1] / "bridge"

FLOORS = {
    "config": ("bridge.config",),
    "validation": ("bridge.config", "bridge.validation", "bridge.machine", "bridge.memory"),  # memory: its rule
}
"""A package of bridge -> the graphbridge modules it may import (prefixes)."""


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
              for path in sorted((BRIDGE / package).rglob("*.py"))
              for line, module in imported_modules(path) if not allowed(module, FLOORS[package])]
    assert not strays, "\n".join(strays)


def test_the_import_check_sees_imports_inside_functions(tmp_path):
    module = tmp_path / "late.py"
    module.write_text("def build():\n    from bridge.translate import megatron_arguments\n")
    assert list(imported_modules(module)) == [(2, "bridge.translate")]
    assert not allowed("bridge.translate", FLOORS["validation"])
