"""The Brain's schema, as versioned migrations applied at start (see infra.db.migrate).

One list per dialect: PostgreSQL for the distributed mode, SQLite for the embedded one.
Both describe the same tables; the store functions run unchanged on either.
"""

from __future__ import annotations

from infra.parked import MIGRATION as PARKED

# Found by the waiting benchmark (10,000 turns): without these, claiming a turn scanned every
# earlier turn of its thread, the wake check and the stall scan read every execution, and each
# re-sent command read the whole outbox (inside the scan's transaction, holding its locks).
_INDEXES = """
CREATE INDEX outbox_message ON outbox (message_id);
CREATE INDEX turns_thread_open ON turns (thread_id, seq)
    WHERE status NOT IN ('completed', 'failed', 'cancelled');
CREATE INDEX executions_turn_step ON executions (turn_id, tool_step);
CREATE INDEX executions_open ON executions (updated_at) WHERE status IN ('intended', 'accepted', 'running');
"""


# Whether an execution has events held back for a gap. A column, not only the held_events rows:
# the in-place apply (executions.receive) must see a hold that committed while it waited for
# the row lock, and PostgreSQL rechecks a waiting UPDATE's conditions on the new row version.
_HOLDING = """
ALTER TABLE executions ADD COLUMN holding boolean NOT NULL DEFAULT false;
UPDATE executions SET holding = true WHERE id IN (SELECT execution_id FROM held_events);
"""

# The claim takes the first claimable turn by (wake_at, seq): with the index in that order the
# claim walks it and stops at the first turn it may take, instead of sorting every claimable
# turn (about 4 ms per claim with 3,000 waiting for a driver, 0.1 ms this way).
_CLAIM_ORDER = """
DROP INDEX turns_claimable;
CREATE INDEX turns_claimable ON turns (wake_at, seq) WHERE status IN ('queued', 'running');
"""

# Liveness by a lease renewed in time, beside the lock (infra.liveness); runs numbered per turn
# (the claim counts them; existing turns count the runs they had); nudges of an execution that
# got no answer, counted towards giving up (brain.scanner).
_LEASES_PG = """
ALTER TABLE workers ADD COLUMN lease_expires_at timestamptz, ADD COLUMN lock_lost_at timestamptz,
    ADD COLUMN dead_at timestamptz;
ALTER TABLE turns ADD COLUMN runs int NOT NULL DEFAULT 0;
UPDATE turns SET runs = (SELECT count(*) FROM runs r WHERE r.turn_id = turns.id);
ALTER TABLE executions ADD COLUMN nudges int NOT NULL DEFAULT 0;
"""
_LEASES_SQLITE = """
ALTER TABLE workers ADD COLUMN lease_expires_at timestamptz TEXT;
ALTER TABLE workers ADD COLUMN lock_lost_at timestamptz TEXT;
ALTER TABLE workers ADD COLUMN dead_at timestamptz TEXT;
ALTER TABLE turns ADD COLUMN runs int NOT NULL DEFAULT 0;
UPDATE turns SET runs = (SELECT count(*) FROM runs r WHERE r.turn_id = turns.id);
ALTER TABLE executions ADD COLUMN nudges int NOT NULL DEFAULT 0;
"""

# Integrity by construction: each child row is written in the statement or transaction that
# writes its parent (or after it), and the tests check that no run leaves an orphan
# (tests/support.py, PARENTS). The checks cost a lookup and a row lock, a WAL record, on the
# parent of every child row: 22 of the 197 WAL records of a 1-call turn. Also gone: an index the
# (turn_id, call_id) key already serves, and the uniqueness of seq (a sequence hands it out).
_NO_CHECKS_PG = """
ALTER TABLE threads DROP CONSTRAINT IF EXISTS threads_session_id_fkey,
    DROP CONSTRAINT IF EXISTS threads_agent_name_agent_version_fkey;
ALTER TABLE turns DROP CONSTRAINT IF EXISTS turns_session_id_fkey,
    DROP CONSTRAINT IF EXISTS turns_thread_id_fkey, DROP CONSTRAINT IF EXISTS turns_seq_key;
ALTER TABLE runs DROP CONSTRAINT IF EXISTS runs_turn_id_fkey;
ALTER TABLE steps DROP CONSTRAINT IF EXISTS steps_turn_id_fkey;
ALTER TABLE history DROP CONSTRAINT IF EXISTS history_thread_id_fkey,
    DROP CONSTRAINT IF EXISTS history_turn_id_fkey;
ALTER TABLE model_calls DROP CONSTRAINT IF EXISTS model_calls_turn_id_fkey;
ALTER TABLE executions DROP CONSTRAINT IF EXISTS executions_turn_id_fkey;
ALTER TABLE held_events DROP CONSTRAINT IF EXISTS held_events_execution_id_fkey;
ALTER TABLE execution_output DROP CONSTRAINT IF EXISTS execution_output_execution_id_fkey;
ALTER TABLE public_events DROP CONSTRAINT IF EXISTS public_events_session_id_fkey;
DROP INDEX IF EXISTS executions_turn_step;
"""
# SQLite does not check them at all (infra.sqlite leaves its foreign_keys pragma off).
_NO_CHECKS_SQLITE = "DROP INDEX IF EXISTS executions_turn_step;"

POSTGRES: list[tuple[int, str]] = [
    (
        1,
        """
CREATE SEQUENCE worker_lock_seq;
CREATE TABLE workers (
    id text PRIMARY KEY, kind text NOT NULL, lock_key int NOT NULL,
    started_at timestamptz NOT NULL DEFAULT now());

CREATE TABLE agents (
    name text NOT NULL, version text NOT NULL, digest text NOT NULL, definition jsonb NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(), PRIMARY KEY (name, version));

CREATE TABLE bindings (
    route text NOT NULL, name text NOT NULL, digest text NOT NULL, binding jsonb NOT NULL,
    announced_at timestamptz NOT NULL DEFAULT now(), PRIMARY KEY (route, name, digest));

CREATE TABLE sessions (
    id text PRIMARY KEY, namespace text NOT NULL, last_event_seq bigint NOT NULL DEFAULT 0,
    created_at timestamptz NOT NULL DEFAULT now());

CREATE TABLE threads (
    id text PRIMARY KEY, session_id text NOT NULL REFERENCES sessions(id),
    agent_name text NOT NULL, agent_version text NOT NULL,
    bindings jsonb,  -- frozen {tool name: binding} once the first turn prepared
    created_at timestamptz NOT NULL DEFAULT now(),
    FOREIGN KEY (agent_name, agent_version) REFERENCES agents(name, version));

CREATE TABLE turns (
    id text PRIMARY KEY, seq bigserial UNIQUE, namespace text NOT NULL,
    session_id text NOT NULL REFERENCES sessions(id), thread_id text NOT NULL REFERENCES threads(id),
    request_id text NOT NULL, input_digest text NOT NULL, input jsonb NOT NULL,
    status text NOT NULL, phase text NOT NULL, revision int NOT NULL DEFAULT 0,
    lease_owner text, lease_epoch int NOT NULL DEFAULT 0, lease_expires_at timestamptz,
    wake_at timestamptz NOT NULL DEFAULT now(), waiting_for text,
    model_calls int NOT NULL DEFAULT 0, tool_step int NOT NULL DEFAULT 0,
    result jsonb, error jsonb,
    created_at timestamptz NOT NULL DEFAULT now(), updated_at timestamptz NOT NULL DEFAULT now(),
    UNIQUE (namespace, session_id, request_id));
CREATE INDEX turns_claimable ON turns (wake_at) WHERE status IN ('queued', 'running');

CREATE TABLE runs (
    id bigserial PRIMARY KEY, turn_id text NOT NULL REFERENCES turns(id), owner text NOT NULL,
    epoch int NOT NULL, started_phase text NOT NULL,
    started_at timestamptz NOT NULL DEFAULT now());

CREATE TABLE steps (
    id bigserial PRIMARY KEY, turn_id text NOT NULL REFERENCES turns(id), run_id bigint NOT NULL,
    phase text NOT NULL, detail jsonb NOT NULL DEFAULT '{}',
    created_at timestamptz NOT NULL DEFAULT now());

CREATE TABLE history (
    thread_id text NOT NULL REFERENCES threads(id), position int NOT NULL,
    turn_id text NOT NULL REFERENCES turns(id), role text NOT NULL, content jsonb NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(), PRIMARY KEY (thread_id, position));

CREATE TABLE model_calls (
    id bigserial PRIMARY KEY, turn_id text NOT NULL REFERENCES turns(id), run_id bigint NOT NULL,
    reply jsonb NOT NULL, usage jsonb NOT NULL DEFAULT '{}',
    created_at timestamptz NOT NULL DEFAULT now());

CREATE TABLE executions (
    id text PRIMARY KEY, turn_id text NOT NULL REFERENCES turns(id), tool_step int NOT NULL,
    call_id text NOT NULL, route text NOT NULL, tool text NOT NULL, binding_digest text NOT NULL,
    replay_policy text NOT NULL, args jsonb NOT NULL, request_digest text NOT NULL,
    status text NOT NULL, last_seq int NOT NULL DEFAULT 0, attempts int NOT NULL DEFAULT 0,
    result jsonb, error jsonb, how text, evidence text, output_bytes bigint NOT NULL DEFAULT 0,
    replay_requested_at timestamptz,
    created_at timestamptz NOT NULL DEFAULT now(), updated_at timestamptz NOT NULL DEFAULT now(),
    UNIQUE (turn_id, call_id));

CREATE TABLE held_events (
    execution_id text NOT NULL REFERENCES executions(id), seq int NOT NULL, payload bytea NOT NULL,
    received_at timestamptz NOT NULL DEFAULT now(), PRIMARY KEY (execution_id, seq));

CREATE TABLE execution_output (
    execution_id text NOT NULL REFERENCES executions(id), byte_offset bigint NOT NULL,
    data text NOT NULL, PRIMARY KEY (execution_id, byte_offset));

CREATE TABLE outbox (
    id bigserial PRIMARY KEY, queue text NOT NULL, message_id text NOT NULL, payload bytea NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(), published_at timestamptz);
CREATE INDEX outbox_unpublished ON outbox (id) WHERE published_at IS NULL;

CREATE TABLE public_events (
    session_id text NOT NULL REFERENCES sessions(id), seq bigint NOT NULL, turn_id text,
    kind text NOT NULL, data jsonb NOT NULL DEFAULT '{}',
    created_at timestamptz NOT NULL DEFAULT now(), PRIMARY KEY (session_id, seq));
""",
    ),
    (
        2,
        """
ALTER TABLE turns ADD COLUMN retries int NOT NULL DEFAULT 0;
ALTER TABLE executions ADD COLUMN command_message_id text;
""",
    ),
    (3, _INDEXES),
    (4, "ALTER TABLE executions ADD COLUMN stall_backoff int NOT NULL DEFAULT 1;"),
    (5, _HOLDING),
    (6, _CLAIM_ORDER),
    (7, _LEASES_PG),
    (8, PARKED["postgres"]),
    (9, _NO_CHECKS_PG),
]

_NOW = "(strftime('%Y-%m-%dT%H:%M:%f', 'now'))"

SQLITE: list[tuple[int, str]] = [
    (
        1,
        f"""
CREATE TABLE workers (
    id text PRIMARY KEY, kind text NOT NULL, lock_key int NOT NULL,
    started_at timestamptz TEXT NOT NULL DEFAULT {_NOW});

CREATE TABLE agents (
    name text NOT NULL, version text NOT NULL, digest text NOT NULL, definition jsonb TEXT NOT NULL,
    created_at timestamptz TEXT NOT NULL DEFAULT {_NOW}, PRIMARY KEY (name, version));

CREATE TABLE bindings (
    route text NOT NULL, name text NOT NULL, digest text NOT NULL, binding jsonb TEXT NOT NULL,
    announced_at timestamptz TEXT NOT NULL DEFAULT {_NOW}, PRIMARY KEY (route, name, digest));

CREATE TABLE sessions (
    id text PRIMARY KEY, namespace text NOT NULL, last_event_seq int NOT NULL DEFAULT 0,
    created_at timestamptz TEXT NOT NULL DEFAULT {_NOW});

CREATE TABLE threads (
    id text PRIMARY KEY, session_id text NOT NULL REFERENCES sessions(id),
    agent_name text NOT NULL, agent_version text NOT NULL, bindings jsonb TEXT,
    created_at timestamptz TEXT NOT NULL DEFAULT {_NOW},
    FOREIGN KEY (agent_name, agent_version) REFERENCES agents(name, version));

CREATE TABLE turns (
    id text PRIMARY KEY, seq int UNIQUE, namespace text NOT NULL,
    session_id text NOT NULL REFERENCES sessions(id), thread_id text NOT NULL REFERENCES threads(id),
    request_id text NOT NULL, input_digest text NOT NULL, input jsonb TEXT NOT NULL,
    status text NOT NULL, phase text NOT NULL, revision int NOT NULL DEFAULT 0,
    lease_owner text, lease_epoch int NOT NULL DEFAULT 0, lease_expires_at timestamptz TEXT,
    wake_at timestamptz TEXT NOT NULL DEFAULT {_NOW}, waiting_for text,
    model_calls int NOT NULL DEFAULT 0, tool_step int NOT NULL DEFAULT 0,
    result jsonb TEXT, error jsonb TEXT,
    created_at timestamptz TEXT NOT NULL DEFAULT {_NOW},
    updated_at timestamptz TEXT NOT NULL DEFAULT {_NOW},
    UNIQUE (namespace, session_id, request_id));
-- PostgreSQL fills seq from a sequence; here the rowid gives the same order.
CREATE TRIGGER turns_seq AFTER INSERT ON turns BEGIN
    UPDATE turns SET seq = NEW.rowid WHERE rowid = NEW.rowid; END;
CREATE INDEX turns_claimable ON turns (wake_at) WHERE status IN ('queued', 'running');

CREATE TABLE runs (
    id INTEGER PRIMARY KEY AUTOINCREMENT, turn_id text NOT NULL REFERENCES turns(id),
    owner text NOT NULL, epoch int NOT NULL, started_phase text NOT NULL,
    started_at timestamptz TEXT NOT NULL DEFAULT {_NOW});

CREATE TABLE steps (
    id INTEGER PRIMARY KEY AUTOINCREMENT, turn_id text NOT NULL REFERENCES turns(id),
    run_id int NOT NULL, phase text NOT NULL, detail jsonb TEXT NOT NULL DEFAULT '{{}}',
    created_at timestamptz TEXT NOT NULL DEFAULT {_NOW});

CREATE TABLE history (
    thread_id text NOT NULL REFERENCES threads(id), position int NOT NULL,
    turn_id text NOT NULL REFERENCES turns(id), role text NOT NULL, content jsonb TEXT NOT NULL,
    created_at timestamptz TEXT NOT NULL DEFAULT {_NOW}, PRIMARY KEY (thread_id, position));

CREATE TABLE model_calls (
    id INTEGER PRIMARY KEY AUTOINCREMENT, turn_id text NOT NULL REFERENCES turns(id),
    run_id int NOT NULL, reply jsonb TEXT NOT NULL, usage jsonb TEXT NOT NULL DEFAULT '{{}}',
    created_at timestamptz TEXT NOT NULL DEFAULT {_NOW});

CREATE TABLE executions (
    id text PRIMARY KEY, turn_id text NOT NULL REFERENCES turns(id), tool_step int NOT NULL,
    call_id text NOT NULL, route text NOT NULL, tool text NOT NULL, binding_digest text NOT NULL,
    replay_policy text NOT NULL, args jsonb TEXT NOT NULL, request_digest text NOT NULL,
    status text NOT NULL, last_seq int NOT NULL DEFAULT 0, attempts int NOT NULL DEFAULT 0,
    result jsonb TEXT, error jsonb TEXT, how text, evidence text, output_bytes int NOT NULL DEFAULT 0,
    replay_requested_at timestamptz TEXT, command_message_id text,
    created_at timestamptz TEXT NOT NULL DEFAULT {_NOW},
    updated_at timestamptz TEXT NOT NULL DEFAULT {_NOW},
    UNIQUE (turn_id, call_id));

CREATE TABLE held_events (
    execution_id text NOT NULL REFERENCES executions(id), seq int NOT NULL, payload bytea BLOB NOT NULL,
    received_at timestamptz TEXT NOT NULL DEFAULT {_NOW}, PRIMARY KEY (execution_id, seq));

CREATE TABLE execution_output (
    execution_id text NOT NULL REFERENCES executions(id), byte_offset int NOT NULL,
    data text NOT NULL, PRIMARY KEY (execution_id, byte_offset));

CREATE TABLE outbox (
    id INTEGER PRIMARY KEY AUTOINCREMENT, queue text NOT NULL, message_id text NOT NULL,
    payload bytea BLOB NOT NULL, created_at timestamptz TEXT NOT NULL DEFAULT {_NOW},
    published_at timestamptz TEXT);
CREATE INDEX outbox_unpublished ON outbox (id) WHERE published_at IS NULL;

CREATE TABLE public_events (
    session_id text NOT NULL REFERENCES sessions(id), seq int NOT NULL, turn_id text,
    kind text NOT NULL, data jsonb TEXT NOT NULL DEFAULT '{{}}',
    created_at timestamptz TEXT NOT NULL DEFAULT {_NOW}, PRIMARY KEY (session_id, seq));
""",
    ),
    (
        2,
        """
ALTER TABLE turns ADD COLUMN retries int NOT NULL DEFAULT 0;
""",
    ),
    (3, _INDEXES),
    (4, "ALTER TABLE executions ADD COLUMN stall_backoff int NOT NULL DEFAULT 1;"),
    (5, _HOLDING),
    (6, _CLAIM_ORDER),
    (7, _LEASES_SQLITE),
    (8, PARKED["sqlite"]),
    (9, _NO_CHECKS_SQLITE),
]

MIGRATIONS: dict[str, list[tuple[int, str]]] = {"postgres": POSTGRES, "sqlite": SQLITE}
