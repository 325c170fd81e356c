"""Ways to place replicas other than child processes of the gateway (see supervisor.py)."""
