"""Metadata of sessions and threads: set at a submit, shown by the sessions and threads lists,
found by the sessions list's search (``key=value`` or a part of it), kept to its namespace, and
checked before anything is written. On both stores; the API and the `brain submit` flags over a
local Tendon."""

from __future__ import annotations

import argparse
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from brain import verbs
from brain.face import commands
from brain.store import BrainStore
from brain.verbs import browse
from infra.process.settings import Settings
from local.testing import LocalTendon, local_tendon
from protocol import SchemaError
from tests.test_agui import GREETER
from tests.test_brain_store import AGENT, store

__all__ = ["store"]  # the fixture, used by name


async def _submit(store: BrainStore, session: str, namespace: str = "ns", **metadata: dict[str, str]) -> str:
    turn_id, _ = await verbs.submit(
        store, namespace=namespace, session_id=session, request_id="r1", user_input="hi", agent=AGENT,
        wake_channel="wake", **metadata,
    )  # fmt: skip
    return turn_id


async def test_metadata_set_at_submit_is_listed_searched_and_kept_to_its_namespace(store: BrainStore) -> None:
    # Given sessions with metadata, and one of another namespace with the same
    await _submit(store, "s-blue", metadata={"team": "blue", "customer": "Acme Corp"})
    await _submit(store, "s-red", metadata={"team": "red"}, thread_metadata={"channel": "email"})
    await _submit(store, "s-none")
    await _submit(store, "s-other", namespace="other", metadata={"team": "blue"})

    # Then the sessions list shows each one's metadata
    listed = {s["id"]: s["metadata"] for s in (await browse.sessions(store, namespace="ns"))["sessions"]}
    assert listed == {
        "s-blue": {"customer": "Acme Corp", "team": "blue"},
        "s-red": {"team": "red"},
        "s-none": {},
    }
    # And a search finds a session by key=value, or by a part of a value, in its namespace only
    for search, found in (("team=blue", ["s-blue"]), ("acme", ["s-blue"]), ("team=", ["s-red", "s-blue"])):
        page = await browse.sessions(store, namespace="ns", search=search)
        assert [s["id"] for s in page["sessions"]] == found, search
    # And the thread's own metadata is on its thread
    (thread,) = await verbs.threads(store, namespace="ns", session_id="s-red")
    assert thread["metadata"] == {"channel": "email"}

    # And a later submit sets a key again, keeping the others
    turn_id, _ = await verbs.submit(
        store, namespace="ns", session_id="s-blue", request_id="r2", user_input="again", agent=AGENT,
        wake_channel="wake", metadata={"team": "green"},
    )  # fmt: skip
    (blue,) = (await browse.sessions(store, namespace="ns", search="s-blue"))["sessions"]
    assert blue["metadata"] == {"customer": "Acme Corp", "team": "green"}


@pytest.mark.parametrize(
    "metadata",
    [{"": "x"}, {"a key": "x"}, {"k": "x" * 501}, {"k": "nul\x00"}, {f"k{i}": "v" for i in range(33)}],
)
async def test_metadata_a_store_should_not_keep_is_refused_before_anything_is_written(
    store: BrainStore, metadata: dict[str, str]
) -> None:
    with pytest.raises(SchemaError, match="metadata"):
        await _submit(store, "s-bad", metadata=metadata)
    assert (await browse.sessions(store, namespace="ns"))["sessions"] == []


@pytest.fixture
async def local(tmp_path: Path) -> AsyncIterator[LocalTendon]:
    async with local_tendon(tmp_path, "examples.hello_tools") as running:
        yield running


async def test_metadata_through_the_api_and_brain_submit(local: LocalTendon) -> None:
    await local.client.submitted("s-api", "r1", "hi", GREETER, metadata={"source": "api"})
    args = argparse.Namespace(
        session="s-cli", request_id="r1", input="hi", agent=str(_agent_file(local)), thread="main",
        expect_tools=False, meta=["source=cli"], thread_meta=["lane=fast"], if_busy="enqueue", url=local.url,
    )  # fmt: skip
    assert await commands.submit(Settings(url=local.url), args) == 0
    page = await local.client.sessions(search="source=")
    assert {s["id"]: s["metadata"] for s in page["sessions"]} == {
        "s-cli": {"source": "cli"},
        "s-api": {"source": "api"},
    }
    (thread,) = await local.client.threads("s-cli")
    assert thread["metadata"] == {"lane": "fast"}


def _agent_file(local: LocalTendon) -> Path:
    import json
    import tempfile

    path = Path(tempfile.mkdtemp()) / "greeter.json"
    path.write_text(json.dumps(GREETER))
    return path
