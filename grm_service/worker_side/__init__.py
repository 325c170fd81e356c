"""What is loaded inside every serving worker of `serve --workers N` to tie it to the others:
the replica snapshot it follows, each replica's gate shared across the workers, and the
wake-ups between them. Below the gateway, which builds them; `workers/` (above the gateway)
starts the processes and clears a dead worker's share."""
