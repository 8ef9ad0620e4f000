"""The whole system in one process, wired above Brain and Hands: the embedded mode (``embedded``:
SQLite, a local queue and a directory object store behind the distributed mode's interfaces),
`brain serve --local` and `brain demo` (``cli``, ``demo``). Nothing in ``brain/`` or ``hands/``
imports it."""
