"""A third-party-style calculator agent on Temporal, for `--target examples/third_party_agent/chaos-target.toml`."""
