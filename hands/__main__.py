"""``python -m hands`` is the ``hands`` command."""

from hands.cli import main

raise SystemExit(main())
