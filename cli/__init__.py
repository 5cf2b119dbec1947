"""The command lines of the dah tools, one module per tool over the shared options (``cli.options``); the work
is done in the packages below (testbed, chaos, benchmarks, migration_fuzz, reports)."""
