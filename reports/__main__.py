"""``python -m reports``: see ``cli.report``."""

from cli.report import main

raise SystemExit(main())
