"""Scorers (ocr, judge, classify, clip, custom) and the batch scoring flow behind `POST /v1/score`.

A scorer is `fn(item, ctx) -> float` (sync or async): it asks the model through `ctx` (which
records every response and fingerprint) and turns the answer into a number. Raising
`ItemError` (or any exception, for custom scorers) makes that item an error, never a silent 0.
The group scorers (`groups/`: pairwise, listwise) judge a prompt's completions together instead.
"""
