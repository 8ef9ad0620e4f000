"""The rooms' rule: the Brain imports neither the Hands nor the whole-system wiring above both.

A Brain reaches the Hands only through the broker (commands, controls) and object storage, so
that each side can be deployed, scaled and changed on its own; ``local/`` wires both together for
the embedded mode and the ``brain`` command's entry, and so sits above them.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
FORBIDDEN = {"brain": {"hands", "local"}}


def imported(tree: ast.AST) -> Iterator[tuple[int, str]]:
    """Every module a parsed file imports (absolute imports; relative ones stay in their package),
    with its line: ``import x``, ``from x import y``, and ``importlib.import_module("x")`` or
    ``__import__("x")`` with the name written out."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from ((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.lineno, node.module
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            if name in ("import_module", "__import__") and isinstance(node.args[0].value, str):
                yield node.lineno, node.args[0].value


def crossings(root: Path, package: str) -> list[str]:
    """Where a module of ``package`` under ``root`` imports one of the packages it must not."""
    found = []
    for path in sorted((root / package).rglob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        for line, module in imported(tree):
            if module.split(".")[0] in FORBIDDEN[package]:
                found.append(f"{path.relative_to(root)}:{line} imports {module}")
    return found


def test_no_module_of_the_brain_imports_the_hands_or_local() -> None:
    assert crossings(REPO, "brain") == []


def test_the_check_sees_every_way_of_importing(tmp_path: Path) -> None:
    (tmp_path / "brain" / "api").mkdir(parents=True)
    (tmp_path / "brain" / "api" / "ok.py").write_text(
        "from . import models\nfrom brain.store import x\nimport handsome\n"
    )
    (tmp_path / "brain" / "api" / "bad.py").write_text(
        "import hands\n"
        "def later():\n"
        "    from hands.run.reconcile import reconcile\n"
        "    import local.embedded as e\n"
        "    importlib.import_module('hands.store')\n"
    )
    assert crossings(tmp_path, "brain") == [
        "brain/api/bad.py:1 imports hands",
        "brain/api/bad.py:3 imports hands.run.reconcile",
        "brain/api/bad.py:4 imports local.embedded",
        "brain/api/bad.py:5 imports hands.store",
    ]
