"""A real PostgreSQL server for the ledger's tests: initdb into a temp dir, started on a free
port of 127.0.0.1, stopped and removed after. Debian's package (`apt-get install postgresql`)
puts its programs under /usr/lib/postgresql/<version>/bin. PostgreSQL refuses to run as root:
as root, the server runs as the package's `postgres` user."""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.support.procs import free_port

INSTALL = "install Debian's package: apt-get install -y postgresql"


def _bin(name: str) -> str:
    found = shutil.which(name) or next(iter(sorted(glob.glob(
        f"/usr/lib/postgresql/*/bin/{name}"), reverse=True)), None)
    if found is None:
        raise RuntimeError(f"{name} not found: {INSTALL}")
    return found


def _as_user() -> list[str]:
    if os.geteuid() != 0:
        return []
    pwd.getpwnam("postgres")  # KeyError: the package's user is missing
    return ["runuser", "-u", "postgres", "--"]


@contextmanager
def postgres_server() -> Iterator[str]:
    """The URL of a fresh server's `postgres` database (trust auth, user `grm`)."""
    root = Path(tempfile.mkdtemp(prefix="grm-pg-"))
    data, sockets = root / "data", root / "sock"
    sockets.mkdir()
    if os.geteuid() == 0:
        entry = pwd.getpwnam("postgres")
        for path in (root, sockets):
            os.chown(path, entry.pw_uid, entry.pw_gid)
    user, port = _as_user(), free_port()
    try:
        subprocess.run([*user, _bin("initdb"), "-D", str(data), "-U", "grm", "--auth=trust",
                        "--no-sync"], check=True, capture_output=True)
        options = f"-p {port} -k {sockets} -c listen_addresses=127.0.0.1 -c fsync=off"
        subprocess.run([*user, _bin("pg_ctl"), "-D", str(data), "-o", options, "-l",
                        str(root / "log"), "-w", "start"], check=True, capture_output=True)
        yield f"postgresql://grm@127.0.0.1:{port}/postgres"
    finally:
        if (data / "postmaster.pid").exists():
            subprocess.run([*user, _bin("pg_ctl"), "-D", str(data), "-m", "immediate", "-w",
                            "stop"], capture_output=True, check=False)
        shutil.rmtree(root, ignore_errors=True)
