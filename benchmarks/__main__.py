from benchmarks.cli import entry

entry()
