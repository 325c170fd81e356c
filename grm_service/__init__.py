"""grm-service: a deterministic scoring service for reward models."""

__version__ = "0.1.0"
