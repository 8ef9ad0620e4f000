"""Sandboxes an agent works in: durable bindings, their lifecycle rows, the backends that hold
them, and the tools that run in them (docs/sandboxes.md).

=================  ==========================================================================
room / module      what it holds
=================  ==========================================================================
``rules/``         pure: the lifecycle state table, identities, markers, paths, the op log
``store/``         the ``sandboxes`` and ``sandbox_uses`` rows (SQL, both dialects)
``backends/``      the ``SandboxBackend`` interface; local POSIX (no isolation) and Docker
``lifecycle``      opening a binding's sandbox for a call: create once, resume, refuse
``chores``         deletion and keep-alive as due rows, request-deletion, reconcile-creation
``tools``          ``sandbox_exec``, ``fs_upload``, ``fs_download``, ``artifact_publish``
``serve``, ``cli`` how a pool serves them (``--sandbox``), and ``hands sandbox``
=================  ==========================================================================
"""
