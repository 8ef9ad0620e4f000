"""An OpenAI Agents SDK agent run durably on a Brain: the same stories as the Pydantic AI one
(``tests/test_frameworks_pydantic_ai.py``), with the SDK's ``Runner`` loop replayed over the
committed replies and its chat-completions model against the local server."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import pytest

from examples.mailbox import MailboxServer
from tests.chat_server import ChatServer
from tests.support import Observer, Processes, TendonEnv
from tests.test_frameworks_pydantic_ai import (
    BRAIN,
    HANDS_EMAIL,
    assert_five_sent_once,
    model_env,
    notice_policy,
    submit,
)
from tests.test_frameworks_pydantic_ai import definition as _definition

pytest.importorskip("agents")

pytestmark = pytest.mark.chaos

MODULE = "tests.fw_openai_agents"


@pytest.fixture
def mailbox() -> Iterator[MailboxServer]:
    with MailboxServer(port=0) as server:
        yield server


def definition(tmp: Path, name: str, tools: list[str], **more: Any) -> str:
    return _definition(tmp, name, tools, framework="openai-agents", module=MODULE, **more)


async def test_the_five_email_story_survives_the_hands_and_the_brain_killed_sending_exactly_five(
    tendon: TendonEnv,
    processes: Processes,
    mailbox: MailboxServer,
    tmp_path: Path,
) -> None:
    with ChatServer(notice_policy) as chat:
        env = model_env(tendon, chat, TENDON_MAILBOX_URL=mailbox.url)
        await processes.start_ready("hands", HANDS_EMAIL, env)
        doomed_hands = await processes.start_ready(
            "hands", HANDS_EMAIL, {**env, "TENDON_KILL_AT": "hands.after_tool_body@call-4"}
        )
        doomed = await processes.start_ready(
            "brain", BRAIN, {**env, "TENDON_KILL_AT": "brain.after_reply_commit@2"}
        )
        turn_id = await submit(env, definition(tmp_path, "notice", ["send_email"]), "Send the notice")
        assert await processes.wait_exit(doomed) == -signal.SIGKILL
        doomed = await processes.start_ready(
            "brain", BRAIN, {**env, "TENDON_KILL_AT": "brain.after_intent_commit@call-3"}
        )
        assert await processes.wait_exit(doomed) == -signal.SIGKILL
        await processes.start_ready("brain", BRAIN, env)
        obs = Observer(tendon)
        turn = await obs.wait_turn(turn_id, "completed", timeout=90)

        assert_five_sent_once(mailbox)
        rows = await obs.executions(turn_id)
        assert [r["status"] for r in rows] == ["succeeded"] * 5
        if doomed_hands.poll() is not None:  # the 4th email went to the doomed worker: verified, not re-sent
            assert rows[3]["how"] == "verified_by_query"
        for r in rows:
            assert r["result"]["message_id"] in turn["result"]["text"]
        assert len(chat.requests) == 6 == len(await obs.facts(turn_id, "turn.model_replied"))
