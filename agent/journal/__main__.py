"""``python -m agent.journal ...``: the old spelling of ``dah checkpoint ...``."""

import sys

from harness.exit import exit_now
from testbed.checkpoint_cli import main

exit_now(main(sys.argv[1:]))
