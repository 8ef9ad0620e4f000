-- Session ids, threads and agent registrations belong to their namespace: two namespaces may each
-- have a session "s1" and an agent "support" version 1 of their own, and neither learns of the
-- other's. A session is keyed "namespace/session id" in the store (sessions, threads, turns, the
-- journal), so everything keyed by a session or a thread stays apart by construction; the ids
-- users and the Hands see are still the session ids they gave. Agents are keyed by namespace.

-- Agents: each namespace that runs a version gets its own row of it; a version no thread runs is
-- kept in every namespace that has a session (which one registered it is not recorded).
CREATE TABLE agents_by_namespace (
    namespace text NOT NULL, name text NOT NULL, version text NOT NULL, digest text NOT NULL,
    definition jsonb TEXT NOT NULL,
    created_at timestamptz TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%f', 'now')),
    PRIMARY KEY (namespace, name, version));
INSERT INTO agents_by_namespace (namespace, name, version, digest, definition, created_at)
SELECT u.namespace, a.name, a.version, a.digest, a.definition, a.created_at
  FROM agents a
  JOIN (SELECT DISTINCT s.namespace, th.agent_name, th.agent_version
          FROM threads th JOIN sessions s ON s.id = th.session_id
        UNION
        SELECT DISTINCT s.namespace, a2.name, a2.version
          FROM agents a2 CROSS JOIN sessions s
         WHERE NOT EXISTS (SELECT 1 FROM threads th
                            WHERE th.agent_name = a2.name AND th.agent_version = a2.version)
       ) AS u ON u.agent_name = a.name AND u.agent_version = a.version;
DROP TABLE agents;
ALTER TABLE agents_by_namespace RENAME TO agents;

-- Sessions and threads: their ids become the store's keys (the journal and the threads first,
-- while the sessions still have the ids they are found by).
UPDATE journal
   SET session_id = (SELECT s.namespace FROM sessions s WHERE s.id = journal.session_id) || '/' || session_id,
       thread_id = (SELECT s.namespace FROM sessions s WHERE s.id = journal.session_id) || '/' || thread_id
 WHERE session_id IN (SELECT id FROM sessions);
UPDATE threads
   SET id = (SELECT s.namespace FROM sessions s WHERE s.id = threads.session_id) || '/' || id,
       session_id = (SELECT s.namespace FROM sessions s WHERE s.id = threads.session_id) || '/' || session_id
 WHERE session_id IN (SELECT id FROM sessions);
UPDATE turns SET session_id = namespace || '/' || session_id, thread_id = namespace || '/' || thread_id;
UPDATE sessions SET id = namespace || '/' || id;
