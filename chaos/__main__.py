import sys

from chaos.cli import main

sys.exit(main())
