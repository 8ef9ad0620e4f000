import sys

from brain.cli import main

sys.exit(main())
