"""HTTP header names that clients and the gateway share (a client tool imports this, never the
server)."""

from __future__ import annotations

# Routing override for checks that must reach one replica (e.g. `verify`).
PIN_HEADER = "x-grm-pin-replica"
# The ledger's tags of a request (grm_service/ledger): a training run's name and its step.
RUN_HEADER = "x-grm-run"
STEP_HEADER = "x-grm-step"
