from harness.exit import exit_now
from testbed.cli import main

exit_now(main())
