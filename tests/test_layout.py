"""The layout holds the rules it implies: rooms import only downwards, rules do no I/O, SQL lives
only in the rooms that own tables, modules and functions stay small.

The rooms, lowest first, and what each may import (besides itself and the standard library):

=======================  =========================================================================
room                     may import
=======================  =========================================================================
``protocol``             nothing of the project
``infra/process``        protocol
``infra/db``             infra/process, protocol
``infra/transport``      infra/db, infra/process, protocol
``infra/objects``        infra/process, protocol
``infra/liveness``       infra/db, infra/transport, infra/process, protocol
``brain/rules``          brain/models/base (the contract's types), protocol; no I/O library
``brain/models``         brain/models, protocol
``brain/store``          brain/rules, infra, protocol
``brain/run``            brain/rules, brain/models, brain/store, infra, protocol
``brain/verbs``          brain/rules, brain/store, infra, protocol
``brain/api``            brain/rules, brain/store, brain/run, brain/verbs, infra, protocol
``brain/frameworks``     brain/rules, brain/models, brain/store, brain/run, infra, protocol (and the
                         frameworks' packages: agents written with them, replayed)
``brain/app.py``         every room of brain/ but face, infra, protocol (the composition root)
``brain/face``           brain/rules, brain/store, brain/verbs, brain/api/auth, brain/app, infra, protocol
``hands/rules``          hands/rules, protocol; no I/O library
``hands/store``          hands/rules, infra, protocol
``hands/tools``          hands/tools, infra, protocol
``hands/run``            hands/rules, hands/store, hands/tools, infra, protocol
``hands/sandbox/rules``  protocol; no I/O library
``hands/sandbox/store``  hands/sandbox/rules, infra, protocol
``hands/sandbox/backends``  hands/sandbox/rules, protocol (and the provider's SDK)
``hands/sandbox``        its rooms above, hands/tools, infra, protocol
``hands`` (app, cli)     every room of hands/, infra, protocol
``local``                anything: the whole system, wired above Brain and Hands
=======================  =========================================================================

Nothing in ``brain/`` imports ``hands/`` or ``local/``; nothing in ``hands/`` imports ``brain/`` or
``local/``. A check that fails names the module, the import and the rule.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PRODUCT = ("brain", "hands", "infra", "protocol", "local")

INFRA = ("infra",)
ROOMS: dict[str, tuple[str, ...]] = {
    "protocol": ("protocol",),
    "infra/process": ("infra/process", "protocol"),
    "infra/db": ("infra/db", "infra/process", "protocol"),
    "infra/transport": ("infra/transport", "infra/db", "infra/process", "protocol"),
    "infra/objects": ("infra/objects", "infra/process", "protocol"),
    "infra/liveness": ("infra/liveness", "infra/db", "infra/transport", "infra/process", "protocol"),
    "brain/rules": ("brain/rules", "brain/models/base", "protocol"),
    "brain/models": ("brain/models", "protocol"),
    "brain/store": ("brain/store", "brain/rules", *INFRA, "protocol"),
    "brain/run": ("brain/run", "brain/rules", "brain/models", "brain/store", *INFRA, "protocol"),
    "brain/verbs": ("brain/verbs", "brain/rules", "brain/store", *INFRA, "protocol"),
    "brain/api": ("brain/api", "brain/rules", "brain/store", "brain/run", "brain/verbs", *INFRA, "protocol"),
    "brain/frameworks": (
        "brain/frameworks",
        "brain/rules",
        "brain/models",
        "brain/store",
        "brain/run",
        *INFRA,
        "protocol",
    ),  # fmt: skip
    "brain/app.py": (
        "brain/frameworks",
        "brain/rules",
        "brain/models",
        "brain/store",
        "brain/run",
        "brain/verbs",
        "brain/api",
        *INFRA,
        "protocol",
    ),  # fmt: skip
    "brain/face": (
        "brain/face",
        "brain/rules",
        "brain/store",
        "brain/verbs",
        "brain/api/auth",
        "brain/app",
        *INFRA,
        "protocol",
    ),  # fmt: skip
    "brain/__main__.py": ("infra/process",),
    "brain/__init__.py": ("brain/face",),  # the client, loaded when asked for
    "infra/__init__.py": (),
    "hands/rules": ("hands/rules", "protocol"),
    "hands/store": ("hands/store", "hands/rules", *INFRA, "protocol"),
    "hands/tools": ("hands/tools", *INFRA, "protocol"),
    "hands/run": ("hands/run", "hands/rules", "hands/store", "hands/tools", *INFRA, "protocol"),
    "hands/sandbox/rules": ("hands/sandbox/rules", "protocol"),
    "hands/sandbox/store": ("hands/sandbox/store", "hands/sandbox/rules", *INFRA, "protocol"),
    "hands/sandbox/backends": ("hands/sandbox/backends", "hands/sandbox/rules", "protocol"),
    "hands/sandbox": ("hands/sandbox", "hands/tools", *INFRA, "protocol"),
    "hands": ("hands", *INFRA, "protocol"),
    "local": ("local", "brain", "hands", *INFRA, "protocol"),
}
# Libraries that do I/O: a rule imports none of them.
IO_LIBRARIES = (
    "asyncio", "asyncpg", "aio_pika", "aiormq", "aiohttp", "boto3", "botocore", "fastapi", "httpx", "openai",
    "socket", "sqlite3", "subprocess", "uvicorn", "infra",
)  # fmt: skip
PURE_ROOMS = ("brain/rules", "hands/rules", "hands/sandbox/rules")

# The rooms that own tables, and so their SQL: the two stores, the database room (the parked
# messages both stores keep), liveness (the workers table) and the local queue (its own file).
SQL_ROOMS = (
    "brain/store", "hands/store", "hands/sandbox/store", "infra/db", "infra/liveness",
    "infra/transport/localqueue.py",
)  # fmt: skip
SQL = re.compile(
    r"\b(SELECT\s+[\w*(]|INSERT\s+INTO\b|DELETE\s+FROM\b|UPDATE\s+\w+\s+(AS\s+\w+\s+|\w+\s+)?SET\b)"
)

MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 60


def _modules() -> list[Path]:
    return sorted(p for top in PRODUCT for p in (ROOT / top).rglob("*.py") if "__pycache__" not in p.parts)


def _name(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def _room(path: Path) -> str:
    """The longest room (a folder, or a file) that holds ``path``."""
    name = _name(path)
    held = [r for r in ROOMS if name == r or name.startswith(r + "/")]
    return max(held, key=len)


def _imports(path: Path) -> list[tuple[int, str]]:
    """(line, module as a path) of every import of the module, wherever it stands."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found += [(node.lineno, node.module)]
            found += [(node.lineno, f"{node.module}.{a.name}") for a in node.names]
    return [(line, name.replace(".", "/")) for line, name in found]


def _within(target: str, allowed: str) -> bool:
    return target == allowed or target.startswith(allowed + "/")


def _of_ours(target: str) -> bool:
    return target.split("/")[0] in PRODUCT


def _resolvable(target: str) -> bool:
    """Whether the import names a module or package of ours (``from a.b import name`` also
    yields ``a/b/name``, which is a module only sometimes)."""
    return (ROOT / f"{target}.py").exists() or (ROOT / target / "__init__.py").exists()


def test_rooms_import_only_what_their_rule_allows() -> None:
    broken = []
    for path in _modules():
        room = _room(path)
        for line, target in _imports(path):
            if not _of_ours(target) or not _resolvable(target) or target in PRODUCT:
                continue  # ``from brain import verbs`` is judged by ``brain/verbs``
            if not any(_within(target, allowed) for allowed in ROOMS[room]):
                broken.append(
                    f"{_name(path)}:{line} imports {target} ({room} may import {', '.join(ROOMS[room])})"
                )
    assert not broken, "\n".join(broken)


def test_the_brain_never_imports_the_hands_nor_the_whole_system() -> None:
    for top, foreign in (("brain", ("hands", "local")), ("hands", ("brain", "local"))):
        for path in (ROOT / top).rglob("*.py"):
            for line, target in _imports(path):
                assert target.split("/")[0] not in foreign, f"{_name(path)}:{line} imports {target}"


@pytest.mark.parametrize("room", PURE_ROOMS)
def test_rules_import_no_library_that_does_io(room: str) -> None:
    for path in (ROOT / room).rglob("*.py"):
        for line, target in _imports(path):
            top = target.split("/")[0]
            assert top not in IO_LIBRARIES, f"{_name(path)}:{line} imports {target}: rules do no I/O"


def test_sql_is_written_only_in_the_rooms_that_own_tables() -> None:
    found = []
    for path in _modules():
        name = _name(path)
        if any(_within(name, room) for room in SQL_ROOMS):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and SQL.search(node.value):
                found.append(f"{name}:{node.lineno}: {node.value.strip()[:60]!r}")
    assert not found, "SQL outside the stores:\n" + "\n".join(found)


def test_no_module_is_over_400_lines() -> None:
    long = [(n, _name(p)) for p in _modules() if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES]
    assert not long, long


def test_no_function_is_over_60_lines_but_argparse_tables() -> None:
    long = []
    for path in _modules():
        source = path.read_text()
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = (node.end_lineno or node.lineno) - node.lineno + 1
                table = "add_argument(" in (ast.get_source_segment(source, node) or "")
                if lines > MAX_FUNCTION_LINES and not table:
                    long.append(f"{_name(path)}:{node.lineno} {node.name} ({lines} lines)")
    assert not long, "\n".join(long)


def test_the_checks_see_what_they_look_for() -> None:
    # The walk finds imports however they are written, and the SQL pattern the statements
    # the stores write: a check that saw nothing would pass for nothing.
    sample = ROOT / "brain" / "face" / "commands.py"
    assert any(target == "brain/app" for _, target in _imports(sample))  # imported inside a function
    assert SQL.search("UPDATE turns AS t SET status = 'x'") and SQL.search("SELECT id FROM turns")
    assert SQL.search("INSERT INTO journal (a) VALUES ($1)") and not SQL.search("select the newest version")
    assert _room(ROOT / "brain" / "store" / "turns.py") == "brain/store"
    assert _room(ROOT / "hands" / "app.py") == "hands"
