"""Each service's own work dir: its replicas' logs and temp folders and, by default, its ledger.

Two services on one machine never write one file unless told to. Without `--work-dir`, a service
takes a folder of its own below the run root (`~/.cache/grm-service/run`), named by its port, so
a service started again on its port finds its ledger again; where a live service already holds
that folder (the same port on another address), it takes one named by its pid as well. A work
dir given on purpose is used as given, and refused while another live service holds it.

A service holds its folder with an exclusive `flock` on `service.lock` in it, for as long as it
runs: the kernel lets the lock go with the process, however it ends, so a folder is never left
claimed by a service that is gone. The file also names the holder, for the refusal's message.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from grm_service.config import Settings
from grm_service.errors import WorkDirBusy

LOCK_FILE = "service.lock"
LEDGER_FILE = "ledger.sqlite"


@dataclass(frozen=True)
class Claim:
    """The folder a service took, and the open file whose lock holds it."""

    path: Path
    fd: int

    def release(self) -> None:
        os.close(self.fd)  # closing the last descriptor lets the lock go


def run_root() -> Path:
    """The folder the default work dirs sit in (the default of `--work-dir`)."""
    root: Path = Settings.model_fields["work_dir"].get_default(call_default_factory=True)
    return root


def default_names(port: int, pid: int) -> list[str]:
    """The folders a service without `--work-dir` tries, in order."""
    return [f"port-{port}", f"port-{port}-pid-{pid}"]


def try_lock(folder: Path, label: str) -> Claim | None:
    """Lock `folder` for this process, or None where a live process holds it."""
    folder.mkdir(parents=True, exist_ok=True)
    fd = os.open(folder / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    os.ftruncate(fd, 0)
    os.write(fd, f"{label}\n".encode())
    return Claim(folder, fd)


def holder(folder: Path) -> str:
    """Who holds `folder`, as its lock file says."""
    try:
        return (folder / LOCK_FILE).read_text().strip() or "another process"
    except OSError:
        return "another process"


def claim(settings: Settings, pid: int) -> Claim:
    """Take the service's work dir: the one given, or its own below the run root."""
    label = f"pid {pid}, {settings.host}:{settings.port}"
    if "work_dir" in settings.model_fields_set:
        taken = try_lock(settings.work_dir, label)
        if taken is None:
            raise WorkDirBusy(
                f"work dir {settings.work_dir} is in use by a live service "
                f"({holder(settings.work_dir)}): two services would write one replica log and "
                "one ledger. Give this one another --work-dir (GRM_WORK_DIR), or leave it out "
                "for a folder of its own")
        return taken
    for name in default_names(settings.port, pid):
        taken = try_lock(settings.work_dir / name, label)
        if taken is not None:
            return taken
    raise WorkDirBusy(f"no free work dir below {settings.work_dir} for port {settings.port}")


@contextlib.contextmanager
def claimed(settings: Settings, pid: int) -> Iterator[Settings]:
    """The settings with the service's own work dir, held until the block ends."""
    taken = claim(settings, pid)
    try:
        yield settings.model_copy(update={"work_dir": taken.path})
    finally:
        taken.release()


def ledgers_below(root: Path) -> list[Path]:
    """The default ledgers of the services below the run root (and the root's own, where an
    earlier version kept one for every service)."""
    found = [root / LEDGER_FILE, *sorted(root.glob(f"*/{LEDGER_FILE}"))]
    return [path for path in found if path.is_file()]
