from harness.exit import exit_now
from chaos.cli import main

exit_now(main())
