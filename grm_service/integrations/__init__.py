"""Adapters that let RL trainers (verl, OpenRLHF, TRL) score through grm-service.

See docs/integrations.md for each trainer's copy-paste configuration.
"""
