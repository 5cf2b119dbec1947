from cli.fuzz import entry

entry()
