"""The liveness room: who is alive among Brain and Hands processes, decided by leases (the protocol
is stated in ``lease``), with one backend per database (``registrations``)."""

from infra.liveness.lease import (
    ALIVE_SQL,
    PRUNE_AFTER,
    REGISTER_SQL,
    SETTLE_AT_MOST,
    WORKER_ID_BYTES,
    Liveness,
    Release,
    Renew,
    lock_held_sql,
    new_worker_id,
)

__all__ = [
    "ALIVE_SQL",
    "PRUNE_AFTER",
    "REGISTER_SQL",
    "SETTLE_AT_MOST",
    "WORKER_ID_BYTES",
    "Liveness",
    "Release",
    "Renew",
    "lock_held_sql",
    "new_worker_id",
]
