"""The checked-in JSON Schemas in schemas/ are exactly what the pydantic models generate."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import protocol
from protocol import schemas

REGENERATE = f"schemas/ is out of date with protocol/; regenerate with: {schemas.COMMAND}"


def test_the_schemas_directory_matches_what_the_models_generate():
    changes = schemas.diff(schemas.SCHEMAS_DIR)
    problems = [f"{what}: {name}" for what, names in changes.items() for name in names]
    assert not problems, REGENERATE + "\n" + "\n".join(problems)


def test_there_is_one_schema_file_per_envelope_kind_plus_the_shared_ones():
    rendered = schemas.render()
    kinds = set(schemas.envelope_models())
    assert {"execute", "accepted", "bindings", "cancel", "replay"} <= kinds
    assert set(rendered) == {f"{kind}.json" for kind in kinds} | {
        "envelope.json",
        "object_ref.json",
        "tool_binding.json",
        "README.md",
    }


def test_render_is_deterministic_sorted_indented_and_ends_with_a_newline():
    first, second = schemas.render(), schemas.render()
    assert first == second
    for name, text in first.items():
        assert text.endswith("\n") and not text.endswith("\n\n"), name
        if name.endswith(".json"):
            doc = json.loads(text)
            assert text == json.dumps(doc, sort_keys=True, indent=2, ensure_ascii=False) + "\n"
            assert doc["$schema"] == schemas.SCHEMA_DIALECT
            assert schemas.COMMAND in doc["$comment"]


def test_the_readme_says_the_files_are_generated_and_by_which_command():
    readme = schemas.render()["README.md"]
    assert "generated" in readme.lower()
    assert schemas.COMMAND in readme and schemas.CHECK_COMMAND in readme


def test_each_kind_schema_pins_its_kind_and_the_protocol_version():
    rendered = schemas.render()
    for kind in schemas.envelope_models():
        doc = json.loads(rendered[f"{kind}.json"])
        assert doc["properties"]["kind"]["const"] == kind
        assert doc["properties"]["v"]["const"] == protocol.PROTOCOL_VERSION
        assert doc["additionalProperties"] is False


def test_the_envelope_schema_is_the_union_discriminated_by_kind():
    doc = json.loads(schemas.render()["envelope.json"])
    assert doc["discriminator"]["propertyName"] == "kind"
    assert set(doc["discriminator"]["mapping"]) == set(schemas.envelope_models())
    assert len(doc["oneOf"]) == len(schemas.envelope_models())


# ---- the command itself --------------------------------------------------------------------


def test_check_mode_passes_on_a_fresh_directory_and_writes_nothing(tmp_path: Path, capsys):
    assert schemas.main(["--dir", str(tmp_path)]) == 0
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    assert set(before) == set(schemas.render())
    assert "wrote" in capsys.readouterr().out
    assert schemas.main(["--check", "--dir", str(tmp_path)]) == 0
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before


def test_check_mode_fails_listing_stale_missing_and_extra_files_and_writes_nothing(tmp_path: Path, capsys):
    schemas.main(["--dir", str(tmp_path)])
    (tmp_path / "execute.json").write_text("{}\n")
    (tmp_path / "accepted.json").unlink()
    (tmp_path / "retired.json").write_text("{}\n")
    capsys.readouterr()

    assert schemas.main(["--check", "--dir", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert "stale: " in out and "execute.json" in out
    assert "missing: " in out and "accepted.json" in out
    assert "extra: " in out and "retired.json" in out
    assert schemas.COMMAND in out
    assert (tmp_path / "execute.json").read_text() == "{}\n"
    assert not (tmp_path / "accepted.json").exists()


def test_regenerating_repairs_the_directory_and_reports_what_it_did(tmp_path: Path, capsys):
    schemas.main(["--dir", str(tmp_path)])
    (tmp_path / "execute.json").write_text("{}\n")
    (tmp_path / "retired.json").write_text("{}\n")
    capsys.readouterr()

    assert schemas.main(["--dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "wrote" in out and "execute.json" in out
    assert "removed" in out and "retired.json" in out
    assert "accepted.json" not in out  # unchanged files are not rewritten
    assert schemas.diff(tmp_path) == {"stale": [], "missing": [], "extra": []}


# ---- the schemas describe real traffic -----------------------------------------------------


def test_encoded_envelopes_validate_against_the_generated_schemas():
    jsonschema = pytest.importorskip("jsonschema")
    rendered = schemas.render()
    union = json.loads(rendered["envelope.json"])
    ref = protocol.ObjectRef(uri="s3://b/k", sha256="a" * 64, size=1, scope="n/s", bound_to="e/execute")
    header = {"execution_id": "e", "namespace": "n", "session_id": "s", "request_digest": "d" * 64}
    samples = [
        protocol.ExecuteCommand(**header, body_ref=ref),
        protocol.AcceptedEvent(**header, seq=1, body=protocol.AcceptedBody(worker="w")),
        protocol.SucceededEvent(**header, seq=2, body=protocol.SucceededBody(result=[1, "x"])),
        protocol.BindingsAnnouncement(
            body=protocol.BindingsBody(
                route="r",
                worker="w",
                bindings=[
                    protocol.ToolBinding.build(
                        name="t",
                        version="1",
                        route="r",
                        description="",
                        input_schema={},
                        replay_policy="safe",
                        has_query=False,
                    )
                ],
            )
        ),
    ]
    for envelope in samples:
        data = json.loads(protocol.encode(envelope))
        jsonschema.validate(data, union)
        jsonschema.validate(data, json.loads(rendered[f"{envelope.kind}.json"]))
    bad = json.loads(protocol.encode(samples[1]))
    bad["v"] = 2
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, json.loads(rendered["accepted.json"]))
