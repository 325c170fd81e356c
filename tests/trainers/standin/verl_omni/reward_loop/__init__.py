"""Stand-in for `verl_omni.reward_loop`: its reward managers only."""
