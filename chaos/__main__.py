from chaos.cli import entry

entry()
