"""The garbage collector of a server process, set once it is ready.

A Brain or a Hands worker holds what start-up built (modules, pydantic's validators, FastAPI's
routes, pools: over 80,000 objects) for as long as it lives, and CPython's default collector
walks all of it again at every full collection; it also runs a young collection every 700 new
objects, which a busy server makes in well under a millisecond. Profiled over a drain of 3,000
waiting turns, the Brain spent 0.9 to 1.0 s of its 4.6 to 5.1 s of CPU collecting; with what
start-up built frozen out of the collector and young collections every 10,000 objects, 0.26 s
(docs/benchmarks/NOTES.md, the twelfth round).

Only the ``serve`` commands call this: they own their process. The embedded mode runs in its
user's process, whose collector is the user's to set.
"""

from __future__ import annotations

import gc

from infra.process.logging import get_logger

log = get_logger(__name__)

YOUNG_COLLECTION_EVERY = 10_000  # new objects between young collections (CPython's default: 700)


def settle_heap() -> int:
    """Take every object alive now out of later collections (``gc.freeze``: they live as long
    as the process) and space out the young collections; call it when start-up is done.
    Returns how many objects the collector leaves alone from now on."""
    gc.freeze()
    _, middle, old = gc.get_threshold()
    gc.set_threshold(YOUNG_COLLECTION_EVERY, middle, old)
    frozen = gc.get_freeze_count()
    log.info("heap_settled", frozen_objects=frozen, young_collection_every=YOUNG_COLLECTION_EVERY)
    return frozen
