"""CalcAgent: a third-party-style agent on Temporal that the harness tests through chaos-target.toml."""
