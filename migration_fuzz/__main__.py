from harness.exit import exit_now
from migration_fuzz.cli import main

exit_now(main())
