"""``python -m agent``: the same command line as ``dah`` (testbed/cli.py), kept for those who typed it."""

from harness.exit import exit_now
from testbed.cli import main

exit_now(main())
