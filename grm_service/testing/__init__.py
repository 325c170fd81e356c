"""Test and benchmark support shipped with the package (never used by the service itself)."""
