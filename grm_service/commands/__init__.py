"""CLI commands beyond `serve`: `score` (a folder or manifest through the service) and `demo`."""
