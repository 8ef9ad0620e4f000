"""README.md says what is true: its settings table, its example tool, and the example running."""

from __future__ import annotations

from pathlib import Path

from infra.process.settings import settings_table
from tests.support import REPO, Observer, Processes, TendonEnv, run_cli

README = (REPO / "README.md").read_text()


def test_the_settings_table_is_every_setting_as_the_settings_object_says() -> None:
    shown = README.split("<!-- settings:start -->\n")[1].split("\n<!-- settings:end -->")[0]
    assert shown == settings_table(), "run `python -m infra.process.settings` and paste it into README.md"


def test_the_readme_shows_the_example_tool_as_it_is() -> None:
    assert (REPO / "examples" / "hello_tools.py").read_text().strip() in README


async def test_the_example_tool_and_agent_run_as_the_readme_says(
    tendon: TendonEnv, processes: Processes, tmp_path: Path
) -> None:
    # Given a Brain and the hello pool, started as the README starts them
    tendon.routes.add("hello")
    await processes.start_ready("brain", ["-m", "brain", "serve"], tendon.env)
    hands = ["-m", "hands", "serve", "--route", "hello", "--tools", "examples.hello_tools"]
    await processes.start_ready("hands", hands, tendon.env)

    # When the hello agent's turn is submitted and waited for
    submit = ["-m", "brain", "submit", "--session", "hello", "--request-id", "1"]
    code, out, err = await run_cli([*submit, "--agent", "examples/hello_agent.json", "Say hello"], tendon.env)
    assert code == 0, err
    code, shown, err = await run_cli(["-m", "brain", "wait", out.strip()], tendon.env)

    # Then it completes with what the tool answered
    assert code == 0, err
    assert "Hello, world!" in shown
    (execution,) = await Observer(tendon).executions(out.strip())
    assert (execution["tool"], execution["status"], execution["how"]) == ("greet", "succeeded", "ran")
