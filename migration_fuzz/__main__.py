from migration_fuzz.cli import entry

entry()
