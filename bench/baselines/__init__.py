"""The reference design's RPC shapes, rebuilt from shared/REFERENCE.md to measure against.

Each baseline runs as real processes, a host and a client, started by its ``run_*``
function; the client times its calls with :func:`bench.timing.time_calls`, the same
loop our side uses, and prints the figures as JSON.

- :mod:`bench.baselines.jsonlines`: newline-delimited JSON over one Unix-socket
  connection, served one request at a time, the client holding a lock around each call.
- :mod:`bench.baselines.polling`: request and reply files, the client polling from 50 ms
  backing off to 250 ms, the host scanning every 100 ms.
- :mod:`bench.baselines.floor`: a raw 32-byte ping-pong over a Unix socket pair.
"""
