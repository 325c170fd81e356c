"""The reward ledger: every answer on record, read back, replayed, and repeated from the record.

    records.py   Origin (who asked: key id, run, step) and Record (one answered request)
    batches.py   a flush's records packed as one row: the blob, its tags, digests and lookups
    store.py     the Store every database implements: batches written, records read back
    upgrade.py   a ledger of the earlier one-row-per-record layout moved into batches
    location.py  `open_store(location)`: which database a location names; `open_reader`;
                 `check_location`: one that can never work, refused before the service starts
    sqlite.py    the embedded default: one SQLite file in WAL mode, owner-only
    postgres.py  several gateways sharing one ledger (psycopg 3)
    writer.py    batched writes off the event loop; drops counted, never an answer's failure
    cache.py     an identical request answered from the record, identical ones in flight once
                 (within one API key's requests, unless shared)
    book.py      the Ledger: the one object the request path talks to (`Ledger.answer`)
    query.py     reading it back (CLI, `GET /v1/ledger/...`, `grm-service replay`)

The request path hooks in at one point, `proxy.forward`, with the request's canonical body in
hand: the route digest and the request digest come from the same bytes the ledger looks up by.
"""
