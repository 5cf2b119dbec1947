from agent.cli import main
from agent.exit import exit_now

exit_now(main())
