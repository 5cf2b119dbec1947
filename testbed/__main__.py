import sys

from harness.exit import exit_now
from testbed.engines import engine_worker

# ``worker --durability NAME``: another engine's worker, started without importing dah's own commands
code = engine_worker(sys.argv[1:])
if code is None:
    from cli.dah import main

    code = main()
exit_now(code)
