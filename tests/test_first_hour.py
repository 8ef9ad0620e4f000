"""Tendon in a user's tests, on the embedded backend in this process (``local.testing``): the
example tool stops when cancelled and shows its output as it comes; the README's own test example
passes as written."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from local.testing import LocalTendon, local_tendon
from tests.support import REPO, run_cli, wait_for

TIME = r"\d\d:\d\d:\d\d\.\d{3}"


@pytest.fixture
async def tendon(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[LocalTendon]:
    monkeypatch.setenv("BULK_RUNS_FILE", str(tmp_path / "runs.txt"))
    async with local_tendon(tmp_path, "tests.brain_e2e_tools", "examples.hello_tools") as running:
        yield running


def scripted(name: str, script: list[dict[str, Any]], **fields: Any) -> dict[str, Any]:
    return {"name": name, "version": "1", "model": {"kind": "scripted", "script": script}, **fields}


async def test_the_example_counting_tool_stops_at_once_when_cancelled(tendon: LocalTendon) -> None:
    counter = scripted(
        "counter", [{"tool_calls": [{"tool": "count", "args": {"to": 1000, "every": 60}}]}], tools=["count"]
    )
    turn_id = await tendon.submit(counter, "count slowly")

    async def counted() -> Any:
        found = (await tendon.client.turn(turn_id))["executions"]
        return found and (await tendon.client.output(found[0]["id"]))["pages"]

    await wait_for(counted, timeout=30, what="the first number")
    await tendon.client.control(turn_id, "cancel")
    turn = await tendon.wait(turn_id, within=30)  # not the 60 s the next number would take
    assert turn["status"] == "cancelled"
    assert turn["executions"][0]["status"] == "cancelled"


async def test_the_readmes_test_example_passes_as_written() -> None:
    readme = (REPO / "README.md").read_text()
    example = (REPO / "examples" / "test_hello.py").read_text()
    assert example.strip() in readme
    code, out, err = await run_cli(
        ["-m", "pytest", "-q", "-n", "0", "-p", "no:cacheprovider", "examples/test_hello.py"], {}
    )
    assert code == 0, out + err
    assert "2 passed" in out
