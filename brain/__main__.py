"""``python -m brain`` is the ``brain`` command (``infra.process.entry``)."""

import sys

try:  # a Ctrl-C while the program still loads: one line, not a traceback
    from infra.process.entry import brain
except KeyboardInterrupt:
    print("\nbrain: interrupted", file=sys.stderr)
    sys.exit(130)

sys.exit(brain())
