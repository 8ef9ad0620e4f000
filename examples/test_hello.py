"""Testing your own tools and agent with pytest: the whole system runs in the test's process on
the embedded backend (no servers), the tools of ``examples.hello_tools`` in a pool of their own.
Run it with `pytest examples/test_hello.py` (pytest-asyncio installed)."""

import pytest
import pytest_asyncio

from local.testing import local_tendon


@pytest_asyncio.fixture
async def tendon(tmp_path):
    async with local_tendon(tmp_path, "examples.hello_tools") as running:
        yield running


@pytest.mark.asyncio
async def test_the_hello_agent_greets_through_its_tool(tendon):
    turn = await tendon.run("examples/hello_agent.json", "Say hello")
    assert turn["status"] == "completed"
    (call,) = turn["executions"]
    assert (call["tool"], call["status"]) == ("greet", "succeeded")
    assert call["result"]["greeting"] == "Hello, world!"
    assert "Hello, world!" in turn["result"]["text"]


@pytest.mark.asyncio
async def test_the_counting_tool_writes_its_output_as_it_goes(tendon):
    script = [{"tool_calls": [{"tool": "count", "args": {"to": 3, "every": 0}}]}]
    model = {"kind": "scripted", "script": script}
    counter = {"name": "counter", "version": "1", "model": model, "tools": ["count"]}
    turn = await tendon.run(counter, "count to three")
    (call,) = turn["executions"]
    output = await tendon.client.output(call["id"])
    assert "".join(page["data"] for page in output["pages"]) == "1\n2\n3\n"
