"""The framework agents of examples/ in the embedded mode (`brain serve --local`: SQLite, a local
queue, the Brain and the Hands pool in this process): the five-email story written with Pydantic
AI and with the OpenAI Agents SDK, each sending exactly five emails, its model the local
chat-completions server."""

from __future__ import annotations

import json
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from examples.mailbox import MailboxServer
from local.testing import local_tendon
from tests.chat_server import ChatServer
from tests.support import run_cli
from tests.test_frameworks_pydantic_ai import notice_policy


@pytest.fixture
def mailbox() -> Iterator[MailboxServer]:
    with MailboxServer(port=0) as server:
        yield server


@pytest.mark.parametrize(
    ("package", "definition"),
    [("pydantic_ai", "examples/pydantic_email.json"), ("agents", "examples/openai_agents_email.json")],
    ids=["pydantic-ai", "openai-agents"],
)
async def test_the_examples_framework_agent_sends_five_emails_in_the_embedded_mode(
    package: str, definition: str, mailbox: MailboxServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip(package)
    with ChatServer(notice_policy) as chat:
        # Read when the Brain first imports the example (its model's client); fresh per test
        monkeypatch.setenv("OPENAI_BASE_URL", chat.url)
        monkeypatch.setenv("OPENAI_API_KEY", "test")
        monkeypatch.setenv("TENDON_MAILBOX_URL", mailbox.url)
        from brain.frameworks import forget

        forget()
        async with local_tendon(tmp_path, "examples.email_tools") as tendon:
            turn = await tendon.run(definition, "Send the maintenance notice")

    assert turn["status"] == "completed", turn.get("error")
    stats = mailbox.stats()
    assert sorted(d["to"] for d in stats["deliveries"]) == [f"customer{i}@example.com" for i in range(1, 6)]
    assert sorted(stats["posts_per_key"].values()) == [1] * 5
    assert len(chat.requests) == 6
    assert all(m["message_id"] in turn["result"]["text"] for m in stats["deliveries"]), json.dumps(turn)


@pytest.mark.chaos
@pytest.mark.parametrize("agent", ["examples.pydantic_email:agent", "examples.openai_agents_email:agent"])
async def test_brain_demo_tells_the_story_with_a_framework_agent_crashed_at_email_four_and_resumed(
    agent: str, tmp_path: Path
) -> None:
    pytest.importorskip("pydantic_ai" if "pydantic" in agent else "agents")
    with ChatServer(notice_policy) as chat:
        env = {"OPENAI_BASE_URL": chat.url, "OPENAI_API_KEY": "test"}
        demo = ["-m", "brain", "demo", "--agent", agent, "--data-dir", str(tmp_path / "demo")]
        code, out, err = await run_cli([*demo, "--fresh", "--crash-at", "4"], env)
        assert code == -signal.SIGKILL and "email 4 was accepted by the mail service, SIGKILL" in err, err
        code, out, err = await run_cli(demo, env)

    assert code == 0, err
    assert "verified by its operation id, not resent" in out and "mailbox: 5 deliveries" in out
    assert "Receipts: msg-1, msg-2, msg-3, msg-4, msg-5" in out
    assert len(chat.requests) == 6  # the resumed run asked the model nothing it had answered


def test_the_readme_shows_the_pydantic_ai_example_as_it_is() -> None:
    from tests.support import REPO

    example = (REPO / "examples" / "pydantic_email.py").read_text()
    shown = example[example.index("agent = Agent(") :]
    shown = "\n".join(line for line in shown.splitlines() if not line.lstrip().startswith("#"))
    assert shown.strip() in (REPO / "README.md").read_text()
