"""Examples of agents the harness can test (not part of the harness itself)."""
