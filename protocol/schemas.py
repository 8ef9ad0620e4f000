"""Generate the JSON Schemas of the wire protocol from the pydantic models.

The files in ``<repo>/schemas`` are generated, checked in, and compared against
:func:`render` by ``tests/test_schemas_current.py``::

    python -m protocol.schemas           # (re)write schemas/, print what changed
    python -m protocol.schemas --check   # exit 1 listing stale/missing/extra files, write nothing

One file per envelope kind (``execute.json``, ``accepted.json``, ..., ``bindings.json``), the
discriminated union of all envelopes (``envelope.json``), the shared parts
(``object_ref.json``, ``tool_binding.json``) and a ``README.md``. The schemas are the
*validation* schemas: they describe what :func:`protocol.wire.decode` accepts.
"""

from __future__ import annotations

import argparse
import json
import sys
import typing
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, TypeAdapter

from protocol.bindings import ToolBinding
from protocol.envelopes import PROTOCOL_VERSION, Envelope, ObjectRef

COMMAND = "python -m protocol.schemas"
CHECK_COMMAND = f"{COMMAND} --check"
SCHEMA_DIALECT = "https://json-schema.org/draft/2020-12/schema"
SCHEMAS_DIR = Path(__file__).resolve().parent.parent / "schemas"
README = "README.md"


def envelope_models() -> dict[str, type[BaseModel]]:
    """Every envelope model by its ``kind``, read from the ``Envelope`` union itself.

    Deriving this from the union (instead of listing the kinds here) means a new kind gets
    its schema file without anyone remembering to add it.
    """
    union = typing.get_args(Envelope)[0]  # Annotated[Union[...], Field(discriminator=...)]
    models: dict[str, type[BaseModel]] = {}
    for model in typing.get_args(union):
        kind = model.model_fields["kind"].default
        if not isinstance(kind, str) or kind in models:
            raise RuntimeError(f"envelope model {model.__name__} has no unique literal kind")
        models[kind] = model
    return models


def _document(schema: dict[str, Any], title: str) -> dict[str, Any]:
    doc = dict(schema)
    doc["$schema"] = SCHEMA_DIALECT
    doc["$comment"] = (
        f"Generated from the pydantic models in protocol/ by `{COMMAND}`; do not edit. "
        f"Protocol version {PROTOCOL_VERSION}."
    )
    doc.setdefault("title", title)
    return doc


def _text(doc: dict[str, Any]) -> str:
    return json.dumps(doc, sort_keys=True, indent=2, ensure_ascii=False) + "\n"


def _readme(names: Sequence[str], kinds: Sequence[str]) -> str:
    lines = [
        "# Wire protocol JSON Schemas",
        "",
        "Every file in this directory is **generated** from the pydantic models in `protocol/`",
        "(`protocol/envelopes.py`, `protocol/bindings.py`). Do not edit them by hand.",
        "",
        "Regenerate after changing a model (this also removes files that are no longer produced):",
        "",
        "```",
        COMMAND,
        "```",
        "",
        "Check without writing (exits 1 and lists stale, missing and extra files):",
        "",
        "```",
        CHECK_COMMAND,
        "```",
        "",
        "`tests/test_schemas_current.py` fails when these files drift from the models.",
        "",
        "The schemas describe what the strict decoder (`protocol.decode`) accepts, in JSON Schema",
        "2020-12. Two rules live outside them: an envelope carries exactly one of `body` or",
        "`body_ref`, and the strict codec (`protocol.codec.loads`) rejects duplicate keys,",
        "trailing JSON values, NaN/Infinity and numbers a double cannot hold exactly.",
        "",
        "| file | describes |",
        "| --- | --- |",
        "| `envelope.json` | any envelope: the union of all kinds, discriminated by `kind` |",
    ]
    for kind in kinds:
        lines.append(f"| `{kind}.json` | the `{kind}` envelope |")
    lines += [
        "| `object_ref.json` | `body_ref`: a verified reference to a payload in object storage |",
        "| `tool_binding.json` | one tool binding, as announced in `bindings` |",
        "",
    ]
    listed = {"envelope.json", "object_ref.json", "tool_binding.json", README}
    listed |= {f"{kind}.json" for kind in kinds}
    if listed != set(names):  # pragma: no cover - guards the table against drift
        raise RuntimeError(f"README table out of sync: {sorted(listed ^ set(names))}")
    return "\n".join(lines)


def render() -> dict[str, str]:
    """Every file of ``schemas/`` as it should be: file name -> text."""
    files: dict[str, str] = {}
    models = envelope_models()
    for kind, model in sorted(models.items()):
        files[f"{kind}.json"] = _text(_document(model.model_json_schema(), model.__name__))
    files["envelope.json"] = _text(_document(TypeAdapter(Envelope).json_schema(), "Envelope"))
    files["object_ref.json"] = _text(_document(ObjectRef.model_json_schema(), "ObjectRef"))
    files["tool_binding.json"] = _text(_document(ToolBinding.model_json_schema(), "ToolBinding"))
    names = [*files, README]
    files[README] = _readme(names, sorted(models))
    return dict(sorted(files.items()))


def _on_disk(directory: Path) -> dict[str, Path]:
    if not directory.is_dir():
        return {}
    return {p.name: p for p in directory.iterdir() if not p.name.startswith(".")}


def diff(directory: Path = SCHEMAS_DIR) -> dict[str, list[str]]:
    """Compare ``directory`` with :func:`render`: the stale, missing and extra file names."""
    expected = render()
    present = _on_disk(directory)
    stale = [
        name
        for name, text in expected.items()
        if name in present
        and (not present[name].is_file() or present[name].read_bytes() != text.encode("utf-8"))
    ]
    missing = [name for name in expected if name not in present]
    extra = sorted(name for name in present if name not in expected)
    return {"stale": stale, "missing": missing, "extra": extra}


def write(directory: Path = SCHEMAS_DIR) -> dict[str, list[str]]:
    """Make ``directory`` equal to :func:`render`; return what was written and removed."""
    directory.mkdir(parents=True, exist_ok=True)
    changes = diff(directory)
    expected = render()
    written = sorted(changes["stale"] + changes["missing"])
    for name in written:
        (directory / name).write_bytes(expected[name].encode("utf-8"))
    removed = []
    for name in changes["extra"]:
        path = directory / name
        if path.is_file() or path.is_symlink():
            path.unlink()
            removed.append(name)
    return {"written": written, "removed": removed}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog=COMMAND, description="Generate the wire protocol's JSON Schemas into schemas/."
    )
    parser.add_argument(
        "--check",
        action="store_true",
        help="write nothing; exit 1 and list stale, missing and extra files",
    )
    parser.add_argument(
        "--dir", type=Path, default=SCHEMAS_DIR, help=f"target directory (default {SCHEMAS_DIR})"
    )
    args = parser.parse_args(argv)
    directory: Path = args.dir

    if args.check:
        changes = diff(directory)
        problems = [(what, name) for what, names in changes.items() for name in names]
        if not problems:
            print(f"{directory}: {len(render())} files up to date")
            return 0
        for what, name in problems:
            print(f"{what}: {directory / name}")
        print(f"{directory} is out of date; regenerate with: {COMMAND}")
        return 1

    result = write(directory)
    for name in result["written"]:
        print(f"wrote {directory / name}")
    for name in result["removed"]:
        print(f"removed {directory / name}")
    if not result["written"] and not result["removed"]:
        print(f"{directory}: {len(render())} files already up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())
