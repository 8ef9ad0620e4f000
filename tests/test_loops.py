"""The background loop every scanner, relay, keeper and pruner runs on (infra.process.loops), without
servers: its pace, its wake-up, its backoff, what it says about failures, and what ends it."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import pytest

from infra.process import loops
from infra.process.loops import BackgroundLoop, Backoff, worth_a_warning


class Warnings:
    """Stands in for the module's logger: keeps what was said at warning level."""

    def __init__(self) -> None:
        self.said: list[dict[str, Any]] = []

    def warning(self, event: str, **fields: Any) -> None:
        self.said.append({"event": event, **fields})


@pytest.fixture
def warnings(monkeypatch: pytest.MonkeyPatch) -> Warnings:
    caught = Warnings()
    monkeypatch.setattr(loops, "log", caught)
    return caught


@asynccontextmanager
async def running(loop: BackgroundLoop) -> AsyncIterator[asyncio.Task[None]]:
    task = asyncio.create_task(loop.run())
    try:
        yield task
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def until(condition: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    """Wait for ``condition``, looking often; fail the test after ``timeout`` seconds."""
    deadline = asyncio.get_running_loop().time() + timeout
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, f"no {what} within {timeout} s"
        await asyncio.sleep(0.005)


def counting(*outcomes: BaseException | None) -> tuple[list[float], Callable[[], Awaitable[None]]]:
    """A step that notes when it ran and raises the given outcomes in turn (None: succeeds), then
    succeeds."""
    times: list[float] = []

    async def step() -> None:
        times.append(asyncio.get_running_loop().time())
        outcome = outcomes[len(times) - 1] if len(times) <= len(outcomes) else None
        if outcome is not None:
            raise outcome

    return times, step


# ---- the pure rules ---------------------------------------------------------------------------


def test_a_failure_is_said_the_first_the_tenth_and_every_fiftieth_time_in_a_row() -> None:
    said = [n for n in range(1, 251) if worth_a_warning(n)]
    assert said == [1, 10, 50, 100, 150, 200, 250]


def test_the_backoff_doubles_from_its_first_pause_up_to_its_most_even_after_endless_failures() -> None:
    backoff = Backoff(first=0.05, most=0.5)
    assert [backoff(n) for n in (1, 2, 3, 4, 5)] == [0.1, 0.2, 0.4, 0.5, 0.5]
    assert backoff(5000) == 0.5  # 0.05 * 2**5000 is no float: it raised OverflowError


# ---- the pace ---------------------------------------------------------------------------------


async def test_a_loop_runs_its_step_at_once_then_every_period() -> None:
    times, step = counting()
    async with running(BackgroundLoop("test", step, period=0.05)):
        await asyncio.sleep(0)  # the task's first turn: the step runs before any wait
        assert len(times) == 1
        await until(lambda: len(times) >= 4, "fourth round")
    gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
    assert min(gaps) >= 0.045, gaps


async def test_the_first_round_waits_the_first_delay() -> None:
    times, step = counting()
    started = asyncio.get_running_loop().time()
    async with running(BackgroundLoop("test", step, period=0.01, first=0.2)):
        await asyncio.sleep(0.1)
        assert times == []
        await until(lambda: len(times) >= 2, "second round")
    assert times[0] - started >= 0.19


async def test_a_wake_ends_the_wait_at_once_and_counts_once() -> None:
    times, step = counting()
    loop = BackgroundLoop("test", step, period=3600.0)
    async with running(loop):
        await until(lambda: len(times) == 1, "first round")
        loop.wake()
        await until(lambda: len(times) == 2, "round after the wake")
        # The wake-up was used up by that round: the next one waits its period again.
        await asyncio.sleep(0.1)
        assert len(times) == 2


async def test_a_loop_wakes_on_the_event_it_was_given() -> None:
    times, step = counting()
    hint = asyncio.Event()
    async with running(BackgroundLoop("test", step, period=3600.0, wake=hint)):
        await until(lambda: len(times) == 1, "first round")
        hint.set()
        await until(lambda: len(times) == 2, "round after the hint")
        assert not hint.is_set()  # cleared after the wait


async def test_a_wake_before_the_first_delay_is_up_starts_the_first_round() -> None:
    times, step = counting()
    loop = BackgroundLoop("test", step, period=3600.0, first=3600.0)
    async with running(loop):
        await asyncio.sleep(0.05)
        loop.wake()
        await until(lambda: len(times) == 1, "first round")


# ---- failures ---------------------------------------------------------------------------------


async def test_without_a_backoff_a_failed_round_waits_the_period() -> None:
    times, step = counting(*[OSError("the database is away")] * 3)
    async with running(BackgroundLoop("test", step, period=0.05)):
        await until(lambda: len(times) >= 4, "fourth round")
    gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
    assert min(gaps) >= 0.045, gaps


async def test_a_failed_round_waits_the_backoff_of_the_failures_so_far_and_a_success_resets_it() -> None:
    fault = ConnectionResetError("gone")
    times, step = counting(fault, fault, None, fault)
    asked: list[int] = []

    def backoff(failures: int) -> float:
        asked.append(failures)
        return 0.001 if len(asked) < 3 else 3600.0

    loop = BackgroundLoop("test", step, period=0.001, backoff=backoff)
    async with running(loop):
        await until(lambda: len(asked) == 3, "third failure")
        # After the success in between, the count started again.
        assert asked == [1, 2, 1] and len(times) == 4
        # After the last failure the loop waits what the backoff said, not its period.
        await asyncio.sleep(0.1)
        assert len(times) == 4 and loop.failures == 1


async def test_failures_are_said_the_1st_10th_and_every_50th_time_in_a_row_naming_the_loop(
    warnings: Warnings,
) -> None:
    fault = OSError("connection refused")
    times, step = counting(*[fault] * 100, None, fault)
    loop = BackgroundLoop("the-scan", step, period=0.001, backoff=lambda _: 0.0, context={"worker": "w-1"})
    async with running(loop):
        await until(lambda: len(times) >= 102, "102 rounds")
    assert [w["failures"] for w in warnings.said] == [1, 10, 50, 100, 1]
    assert all(
        w == {"event": "loop_failed", "loop": "the-scan", "failures": w["failures"],
              "error": repr(fault), "worker": "w-1"}
        for w in warnings.said
    )  # fmt: skip


async def test_no_error_of_a_step_ends_the_loop(warnings: Warnings) -> None:
    errors = [ValueError("bad"), RuntimeError("bug"), TimeoutError(), KeyError("k"), OSError("away")]
    times, step = counting(*errors)
    async with running(BackgroundLoop("test", step, period=0.001)) as task:
        await until(lambda: len(times) >= 8, "rounds after every error")
        assert not task.done()
    assert len(warnings.said) == 1  # the first of five in a row


# ---- what ends it -----------------------------------------------------------------------------


async def test_a_cancel_while_it_waits_ends_the_loop() -> None:
    times, step = counting()
    task = asyncio.create_task(BackgroundLoop("test", step, period=3600.0).run())
    await until(lambda: len(times) == 1, "first round")
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_a_cancel_that_comes_with_a_wake_up_still_ends_the_loop() -> None:
    times, step = counting()
    hint = asyncio.Event()
    task = asyncio.create_task(BackgroundLoop("test", step, period=3600.0, wake=hint).run())
    await until(lambda: len(times) == 1, "first round")
    hint.set()
    task.cancel()
    await asyncio.wait([task], timeout=5)
    assert task.cancelled()


async def test_a_cancel_inside_the_step_ends_the_loop_and_is_no_failure(warnings: Warnings) -> None:
    inside = asyncio.Event()

    async def step() -> None:
        inside.set()
        await asyncio.Event().wait()

    loop = BackgroundLoop("test", step, period=0.001)
    task = asyncio.create_task(loop.run())
    await inside.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert loop.failures == 0 and warnings.said == []


async def test_a_loop_with_an_end_returns_once_it_is_reached_and_looks_before_each_wait() -> None:
    times, step = counting()
    loop = BackgroundLoop("test", step, period=0.001, until=lambda: len(times) >= 3)
    await asyncio.wait_for(loop.run(), 10)
    assert len(times) == 3
