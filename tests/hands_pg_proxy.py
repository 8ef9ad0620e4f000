"""A TCP proxy in front of PostgreSQL that makes a COMMIT's outcome unclear, for real.

Armed, it forwards a client's ``COMMIT;`` to the server, waits for the server's answer (so
the transaction *did* commit), then drops that answer and cuts the connection: the client
sees its connection lost during COMMIT and cannot tell whether it committed. That is the
case ``transact`` reports as TransientError (outcome unknown). Loopback only.

A commit is also the execution of one of the Hands ledger's batch statements (an accept, a start,
an outcome: ``/* ledger commit */``) outside a transaction: that one statement commits on its
own. The proxy tells it by the prepared statement's name and the server's last ReadyForQuery
status.
"""

from __future__ import annotations

import asyncio
import contextlib

from chaos.proxy import LoopbackProxy

_COMMIT = b"Q\x00\x00\x00\x0cCOMMIT;\x00"  # asyncpg's simple-query COMMIT message
_MOVE = b"/* ledger commit */"  # the ledger's statements that commit alone (hands.store.postgres)
_READY = b"Z\x00\x00\x00\x05"  # ReadyForQuery; the next byte: I idle, T in a transaction, E failed


class _Session:
    """What one client connection's protocol stream has shown so far."""

    def __init__(self) -> None:
        self.idle = True  # the server's last ReadyForQuery said: not in a transaction
        self.moves: set[bytes] = set()  # names of prepared statements that are guarded moves

    def parsed(self, data: bytes) -> None:
        """Remember the name of a Parse message (``P``, length, name, query) of a move."""
        if data[:1] == b"P" and _MOVE in data:
            self.moves.add(data[5 : data.index(b"\x00", 5)])

    def binds_move(self, data: bytes) -> bool:
        """Whether ``data`` starts a Bind (``B``, length, portal, statement) of a move."""
        if data[:1] != b"B":
            return False
        portal_end = data.index(b"\x00", 5)
        return data[portal_end + 1 : data.index(b"\x00", portal_end + 1)] in self.moves


class CommitCutter(LoopbackProxy):
    """``async with CommitCutter(dsn) as proxy``: ``proxy.dsn`` goes through it."""

    default_port = 5432

    def __init__(self, dsn: str) -> None:
        super().__init__(dsn)
        self._skip = 0
        self._cut = 0
        self.cuts = 0  # how many COMMITs were cut so far

    @property
    def dsn(self) -> str:
        return self.url

    def arm(self, *, skip: int = 0, cut: int = 1) -> None:
        """Let the next ``skip`` COMMITs through, then cut the ``cut`` after them."""
        self._skip, self._cut = skip, cut

    async def _connected(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        server_r, server_w = await asyncio.open_connection(*self._target)
        cutting = asyncio.Event()  # set: drop the server's next answer and hang up
        session = _Session()
        up = asyncio.create_task(self._upstream(client_r, server_w, cutting, session))
        down = asyncio.create_task(self._downstream(server_r, client_w, cutting, session))
        self._spawn(up, down)
        try:
            await asyncio.wait({up, down}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (up, down):
                task.cancel()
            for writer in (client_w, server_w):
                writer.close()

    def _should_cut(self) -> bool:
        if self._skip > 0:
            self._skip -= 1
            return False
        if self._cut > 0:
            self._cut -= 1
            self.cuts += 1
            return True
        return False

    async def _upstream(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        cutting: asyncio.Event,
        session: _Session,
    ) -> None:
        with contextlib.suppress(ConnectionError):
            while data := await reader.read(65536):
                session.parsed(data)
                commits = data.endswith(_COMMIT) or (session.idle and session.binds_move(data))
                if commits and self._should_cut():
                    cutting.set()
                writer.write(data)
                await writer.drain()

    @staticmethod
    async def _downstream(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter, cutting: asyncio.Event, session: _Session
    ) -> None:
        with contextlib.suppress(ConnectionError):
            while data := await reader.read(65536):
                if cutting.is_set():
                    return  # the server answered COMMIT: it committed; the client never hears
                ready = data.rfind(_READY)
                if ready >= 0 and ready + 5 < len(data):
                    session.idle = data[ready + 5 : ready + 6] == b"I"
                writer.write(data)
                await writer.drain()
