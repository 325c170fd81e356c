"""The parts of reward_curves.py: `train` (one GRPO run, every reward kept), `plain` (the plain
vLLM deployment it is compared with), `cache` (the repeat answered from the ledger) and
`report` (the table and the plot)."""
