"""Threads' conversations kept in this Brain process (``brain.rules.history`` says how a conversation
is read from the journal): brought up to date from the journal, and handed along by the commits
of this process so that a turn driven here reads nothing before its next model call."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from brain.models import Message
from brain.rules.history import ThreadHistory, needed_executions
from brain.store import BrainStore, Entry, TurnRow
from infra.db import Connection


@dataclass
class ReadAhead:
    """The conversations of several turns, read inside the transaction that moved them (a claim)
    or after it committed (an apply), up to the entries it wrote: kept by
    :meth:`HistoryCache.keep` once it committed, as if each turn's run had read its own."""

    after: dict[str, int]  # thread id -> the seq its cached history had when this was read
    entries: dict[str, list[Entry]]  # session id -> its entries after the least of those seqs
    executions: dict[str, Any]  # what the tool messages of those entries are made of


class HistoryCache:
    """Threads' conversations, kept in this Brain process and brought up to date from the journal.

    A commit of this process brings its thread's history along at once (when nothing else was
    committed in the session meanwhile), so a turn driven here reads nothing before its next model
    call. Bounded: when full, it starts over (a re-read is always correct).
    """

    def __init__(self, store: BrainStore, limit: int = 1024, read_ahead_entries: int = 1000) -> None:
        self.store = store
        self.limit = limit
        # A conversation read ahead is read for many turns at once, by a claim inside its
        # transaction: one that many entries behind (a long session this process never drove) is
        # left to its run instead, which reads it alone.
        self.read_ahead_entries = read_ahead_entries
        self._threads: dict[str, ThreadHistory] = {}

    async def messages(self, conn: Connection, row: TurnRow) -> list[Message]:
        """The conversation of ``row``'s thread, with everything committed for ``row`` so far."""
        history = self._history(row.thread_id)
        if history.valid_for != (row.id, row.revision):
            entries = await self.store.journal.entries(conn, row.session_id, after=history.seq, limit=100_000)
            needed = needed_executions(entries)
            executions = await self.store.executions.executions_by_id(conn, needed) if needed else {}
            history.extend(entries, executions, row.thread_id)
            history.valid_for = (row.id, row.revision)
        return list(history.messages)

    def cached(self, row: TurnRow) -> list[Message] | None:
        """What ``messages`` would return, when the cached conversation is complete for ``row``
        (no read at all); else None."""
        history = self._threads.get(row.thread_id)
        if history is None or history.valid_for != (row.id, row.revision):
            return None
        return list(history.messages)

    def knew(self, row: TurnRow) -> bool:
        """Whether the cached conversation was complete for ``row`` one revision ago (as the run
        that made it wait left it): then :meth:`woken` brings it along without a read."""
        history = self._threads.get(row.thread_id)
        return history is not None and history.valid_for == (row.id, row.revision - 1)

    async def read_ahead(
        self, conn: Connection, rows: Sequence[TurnRow], known: Mapping[str, Any], upto: Mapping[str, int]
    ) -> ReadAhead:
        """Read what the conversations of ``rows`` lack, for all of them at once: one statement
        for their sessions' new entries, one for the executions those name that are not in
        ``known`` (rows the caller read already). ``upto``: the seq of the entry the caller's
        transaction wrote for each turn (by turn id); later entries are left out, and so is a
        conversation more than ``read_ahead_entries`` behind it. Nothing here changes until
        :meth:`keep`."""
        rows = [r for r in rows if upto.get(r.id, 0) - self._seq(r.thread_id) <= self.read_ahead_entries]
        after = {r.thread_id: self._seq(r.thread_id) for r in rows}
        since: dict[str, int] = {}
        for r in rows:
            since[r.session_id] = min(since.get(r.session_id, after[r.thread_id]), after[r.thread_id])
        entries = await self.store.journal.sessions_entries(conn, since) if since else {}
        for session_id, bound in _bounds(rows, upto).items():
            entries[session_id] = [e for e in entries.get(session_id, []) if e.seq <= bound]
        needed = [e for e in needed_executions(e for es in entries.values() for e in es) if e not in known]
        executions = dict(known)
        if needed:
            executions.update(await self.store.executions.executions_by_id(conn, needed))
        return ReadAhead(after, entries, executions)

    def keep(self, read: ReadAhead, rows: Iterable[TurnRow]) -> None:
        """The transaction that read ``read`` committed ``rows`` (as they now stand): their
        threads' conversations are complete for them, unless a thread's cached history moved
        since the read (then the next read catches up)."""
        for row in rows:
            if row.thread_id not in read.after or self._seq(row.thread_id) != read.after[row.thread_id]:
                continue
            history = self._history(row.thread_id)
            new = [e for e in read.entries.get(row.session_id, []) if e.seq > history.seq]
            history.extend(new, read.executions, row.thread_id)
            history.valid_for = (row.id, row.revision)

    def _seq(self, thread_id: str) -> int:
        history = self._threads.get(thread_id)
        return 0 if history is None else history.seq

    def _history(self, thread_id: str) -> ThreadHistory:
        history = self._threads.get(thread_id)
        return self._fresh(thread_id) if history is None else history

    def _fresh(self, thread_id: str) -> ThreadHistory:
        if len(self._threads) >= self.limit:
            self._threads.clear()
        history = self._threads[thread_id] = ThreadHistory()
        return history

    def committed(
        self,
        before: TurnRow,
        after: TurnRow,
        seq: int | None,
        facts: Sequence[Mapping[str, Any]],
        executions: Mapping[str, Any] | None = None,
    ) -> None:
        """This process moved ``before`` to ``after``, journaling ``facts`` as entry ``seq`` (None:
        nothing journaled): keep the cached history complete when it was complete for ``before``
        and the entry directly follows it; else forget that it was (the next read catches up)."""
        history = self._threads.get(after.thread_id)
        if history is None:
            return
        if history.valid_for != (before.id, before.revision):
            history.valid_for = None
        elif seq is None:
            history.valid_for = (after.id, after.revision)
        elif seq == history.seq + 1 and set(needed_executions([_entry(after, seq, facts)])) <= set(
            executions or {}
        ):
            history.extend([_entry(after, seq, facts)], executions or {}, after.thread_id)
            history.valid_for = (after.id, after.revision)
        else:  # not the next entry, or one with results not given here (a cancel closing its calls)
            history.valid_for = None

    def woken(
        self,
        row: TurnRow,
        seq: int,
        facts: Sequence[Mapping[str, Any]],
        outcomes: Mapping[str, Mapping[str, Any]],
    ) -> None:
        """An apply of this process claimed ``row``, whose step's executions it ended, journaling
        ``facts`` as entry ``seq``: when the cached history was complete for the turn as its run
        left it (one revision before) and every result the entry applies is in ``outcomes``, the
        history goes on without a read; else the next read catches up."""
        history = self._threads.get(row.thread_id)
        if history is None or history.valid_for != (row.id, row.revision - 1):
            return
        entry = _entry(row, seq, facts)
        if seq != history.seq + 1 or not set(needed_executions([entry])) <= set(outcomes):
            history.valid_for = None
            return
        history.extend([entry], outcomes, row.thread_id)
        history.valid_for = (row.id, row.revision)

    def started(self, row: TurnRow, seq: int, facts: Sequence[Mapping[str, Any]]) -> None:
        """This process submitted ``row`` and started it in journal entry ``seq``: when that is its
        session's first entry, the entry is the whole history of its thread."""
        if seq != 1:
            return
        history = self._fresh(row.thread_id)
        history.extend([_entry(row, seq, facts)], {}, row.thread_id)
        history.valid_for = (row.id, row.revision)


def _bounds(rows: Sequence[TurnRow], upto: Mapping[str, int]) -> dict[str, int]:
    """The last seq a read ahead keeps per session: that of the latest entry the transaction
    wrote there. A transaction that wrote a session's entry held its row's lock until it
    committed (the seqs are handed out under it), so every entry up to that one is committed with
    it and none after it was visible inside it: a read after the commit keeps what a read inside
    it saw. A session it wrote nothing in is not bounded."""
    bounds: dict[str, int] = {}
    for r in rows:
        if r.id in upto:
            bounds[r.session_id] = max(bounds.get(r.session_id, 0), upto[r.id])
    return bounds


def _entry(row: TurnRow, seq: int, facts: Sequence[Mapping[str, Any]]) -> Entry:
    """The journal entry a commit of this process wrote for ``row``, as a read would give it."""
    return Entry(
        row.session_id, seq, row.thread_id, row.id, None, None, None, [dict(f) for f in facts], row.created_at
    )
