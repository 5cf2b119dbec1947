from cli.bench import entry

entry()
