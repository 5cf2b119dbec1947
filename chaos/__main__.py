from cli.chaos import entry

entry()
