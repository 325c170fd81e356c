"""Group scorers: rewards that judge a prompt's completions together (pairwise, listwise)."""
