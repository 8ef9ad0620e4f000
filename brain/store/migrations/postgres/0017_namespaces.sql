-- Session ids, threads and agent registrations belong to their namespace: two namespaces may each
-- have a session "s1" and an agent "support" version 1 of their own, and neither learns of the
-- other's. A session is keyed "namespace/session id" in the store (sessions, threads, turns, the
-- journal), so everything keyed by a session or a thread stays apart by construction; the ids
-- users and the Hands see are still the session ids they gave. Agents are keyed by namespace.

-- Agents: each namespace that runs a version gets its own row of it; a version no thread runs is
-- kept in every namespace that has a session (which one registered it is not recorded).
ALTER TABLE agents DROP CONSTRAINT agents_pkey;
ALTER TABLE agents ADD COLUMN namespace text;
INSERT INTO agents (namespace, name, version, digest, definition, created_at)
SELECT u.namespace, a.name, a.version, a.digest, a.definition, a.created_at
  FROM agents a
  JOIN (SELECT DISTINCT s.namespace, th.agent_name, th.agent_version
          FROM threads th JOIN sessions s ON s.id = th.session_id
        UNION
        SELECT DISTINCT s.namespace, a2.name, a2.version
          FROM agents a2 CROSS JOIN sessions s
         WHERE NOT EXISTS (SELECT 1 FROM threads th
                            WHERE th.agent_name = a2.name AND th.agent_version = a2.version)
       ) AS u ON u.agent_name = a.name AND u.agent_version = a.version
 WHERE a.namespace IS NULL;
DELETE FROM agents WHERE namespace IS NULL;
ALTER TABLE agents ALTER COLUMN namespace SET NOT NULL;
ALTER TABLE agents ADD PRIMARY KEY (namespace, name, version);

-- Sessions and threads: their ids become the store's keys (the journal and the threads first,
-- while the sessions still have the ids they are found by).
UPDATE journal j SET session_id = s.namespace || '/' || j.session_id,
                     thread_id = s.namespace || '/' || j.thread_id
  FROM sessions s WHERE s.id = j.session_id;
UPDATE threads th SET id = s.namespace || '/' || th.id, session_id = s.namespace || '/' || th.session_id
  FROM sessions s WHERE s.id = th.session_id;
UPDATE turns SET session_id = namespace || '/' || session_id, thread_id = namespace || '/' || thread_id;
UPDATE sessions SET id = namespace || '/' || id;
