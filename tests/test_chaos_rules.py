"""The chaos run's rules, without servers: the plan a seed makes, the verdicts, the report."""

from __future__ import annotations

import subprocess
import sys
from collections import Counter

import pytest

from chaos import report
from chaos.__main__ import PUBLISHED, out_dir, parse
from chaos.compose import option, services_of
from chaos.faults import QUICK, SERVICE_RESTARTS, Fault, Injected, percentile, plan, tally
from chaos.run import Outcome, Shape
from tests.support import REPO


def test_a_plan_injects_every_kind_equally_often_in_an_order_the_seed_decides() -> None:
    kinds = tuple(Fault)
    faults = plan(7, 10 * len(kinds), kinds)
    assert Counter(faults) == {k: 10 for k in kinds}
    assert faults == plan(7, 10 * len(kinds), kinds)  # the seed decides, nothing else
    assert faults != plan(8, 10 * len(kinds), kinds)
    first_round = faults[: len(kinds)]
    assert sorted(first_round) == sorted(kinds)  # every kind before any comes twice
    assert len(plan(1, 5, kinds)) == 5
    with pytest.raises(ValueError):
        plan(1, 3, ())


def test_a_quick_run_leaves_the_services_running() -> None:
    assert not set(QUICK) & SERVICE_RESTARTS and QUICK


def test_a_second_post_of_an_unsafe_tool_is_a_duplicate_and_of_the_safe_one_a_rerun() -> None:
    posts = {"e1": 1, "e2": 2, "e3": 3, "e4": 2, "e5": 2}
    tools = {"e1": "send", "e2": "touch", "e3": "send", "e4": "send_blind"}  # e5: nobody asked
    t = tally(posts, tools)
    assert t.safe_reruns == 1
    assert t.blind_resends == {"e3": 2, "e4": 1, "e5": 1}


def test_recovery_counts_from_the_end_of_the_fault() -> None:
    hit = Injected(Fault.PG_STALL, at=10.0, lifted=13.0, first=13.5, recovered=14.0)
    assert (hit.recovery, hit.first_progress) == (1.0, 0.5)
    assert Injected(Fault.PG_CUT, at=1.0, lifted=1.0).recovery is None
    assert percentile([], 50) is None
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5


def _outcome(**changes: object) -> Outcome:
    out = Outcome(Shape(faults=2, kinds=(Fault.BRAIN_KILL, Fault.PG_CUT)))
    out.injected = [
        Injected(Fault.BRAIN_KILL, 1.0, 1.0, 1.2, 1.5, "brain pid 1"),
        Injected(Fault.PG_CUT, 3.0, 3.0, None, None),
    ]
    out.turns = {"t1": "completed", "t2": "completed"}
    for k, v in changes.items():
        setattr(out, k, v)
    return out


def test_the_report_says_each_verdict_and_recovery_by_kind() -> None:
    out = _outcome()
    assert report.passed(out)
    text = report.markdown(out, "recovery.png")
    assert "| turns lost (not ended) | 0 | ok |" in text
    assert "| brain SIGKILL | 1 | 0.50 | 0.50 | 0.50 | 0.20 | 0 |" in text
    assert "| PostgreSQL connections cut | 1 | - | - | - | - | 1 |" in text
    assert "![recovery by fault kind](recovery.png)" in text


@pytest.mark.parametrize(
    "changes",
    [
        {"turns": {"t1": "completed", "t2": "waiting"}},  # lost
        {"failures": {"t2": "boom"}},
        {"unknown": {"e1": "send"}},  # an UNKNOWN its query could have settled
    ],
)
def test_a_lost_turn_a_failed_one_or_an_unknown_that_was_not_unknown_fails_the_run(
    changes: dict[str, object],
) -> None:
    out = _outcome(**changes)
    assert not report.passed(out)
    assert "**NO**" in report.markdown(out, None)


def test_an_unknown_of_the_tool_that_cannot_be_asked_is_expected() -> None:
    assert report.passed(_outcome(unknown={"e1": "send_blind"}))


@pytest.mark.parametrize(
    "args",
    [["run", "--faults", "0"], ["run", "--kinds", "brain_nap"], ["walk"], ["run", "--url", "http://x"]],
)
def test_bad_arguments_are_one_line_and_exit_2(args: list[str]) -> None:
    done = subprocess.run([sys.executable, "-m", "chaos", *args], cwd=REPO, capture_output=True, text=True)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines()[-1].startswith("chaos")


def test_only_a_full_run_on_the_local_services_writes_over_the_published_results() -> None:
    assert out_dir(parse(["run"])) == PUBLISHED
    for quick_or_compose in (["--quick"], ["--compose"], ["--quick", "--compose"]):
        written = out_dir(parse(["run", *quick_or_compose]))
        assert written != PUBLISHED and written.parent == REPO / ".tendon" / "chaos", written
    assert str(out_dir(parse(["run", "--quick", "--out", "docs/chaos"]))) == "docs/chaos"  # asked for


def test_a_compose_projects_services_are_read_from_its_config() -> None:
    pool = "hands serve --route email --tools examples.email_tools"
    config = {
        "name": "p",
        "services": {
            "brain": {"command": ["brain", "serve"], "environment": {"TENDON_HTTP": "0.0.0.0:8080"}},
            "hands-email": {"image": "tendon:local", "command": pool},
            "db": {"image": "postgres:15", "command": None, "environment": {"POSTGRES_DB": None}},
        },
    }
    services = services_of(config)
    assert services["hands-email"].command[:2] == ["hands", "serve"]
    assert option(services["hands-email"].command, "--route") == "email"
    assert option(services["brain"].command, "--route") is None
    assert services["brain"].environment == {"TENDON_HTTP": "0.0.0.0:8080"}
    assert services["db"].environment == {"POSTGRES_DB": ""} and services["db"].command == []
