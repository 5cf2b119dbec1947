"""``python -m reports``: see ``reports.cli``."""

from reports.cli import main

raise SystemExit(main())
