"""Stand-in for verl-omni (tests/trainers/standin/README.md)."""
