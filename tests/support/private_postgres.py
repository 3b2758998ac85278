"""A PostgreSQL cluster of the drill's own (initdb into a temporary folder, pg_ctl on a free
port and a private socket folder, trust authentication), so that restarting it disturbs no one
else's server. As root, the server runs as the ``postgres`` user (initdb refuses root)."""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from flows.ports import free_port

BINARIES = Path("/usr/lib/postgresql")
SERVER_USER = "postgres"


def binaries() -> Path | None:
    """The newest installed PostgreSQL's bin folder with initdb and pg_ctl, or None."""
    found = [b for b in BINARIES.glob("*/bin") if (b / "initdb").exists() and (b / "pg_ctl").exists()]
    return max(found, key=lambda b: int(b.parent.name), default=None) if BINARIES.is_dir() else None


@dataclass
class PrivateCluster:
    """initdb'd on ``start`` (the first time), stopped for good by ``destroy``."""

    bin: Path
    port: int = field(default_factory=free_port)
    home: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="runledger-pg-")))
    restarts: int = 0
    listen: str = "127.0.0.1"  # listen_addresses
    hba: tuple[str, ...] = ()  # pg_hba.conf lines added after initdb (e.g. a subnet's trust)
    wrap: tuple[str, ...] = ()  # a command prefix for its tools, e.g. ip netns exec HOST

    @property
    def data(self) -> Path:
        return self.home / "data"

    @property
    def url(self) -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/postgres"

    def _run(self, tool: str, *args: str) -> None:
        command = [str(self.bin / tool), *args]
        if os.geteuid() == 0:
            command = ["runuser", "-u", SERVER_USER, "--", *command]
        command = [*self.wrap, *command]
        done = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
        assert done.returncode == 0, (command, done.stdout, done.stderr, self.log())

    def log(self) -> str:
        path = self.home / "server.log"
        return path.read_text(errors="replace")[-3000:] if path.exists() else ""

    def start(self) -> PrivateCluster:
        if not self.data.exists():
            if os.geteuid() == 0:
                user = pwd.getpwnam(SERVER_USER)
                os.chown(self.home, user.pw_uid, user.pw_gid)
            self._run("initdb", "-D", str(self.data), "-U", "postgres", "-A", "trust",
                      "-E", "UTF8", "--no-sync")
            if self.hba:
                with (self.data / "pg_hba.conf").open("a") as conf:
                    conf.write("".join(f"{line}\n" for line in self.hba))
        # fsync off: a restart kills the server, not the machine, so nothing is lost by it.
        self._run("pg_ctl", "start", "-w", "-t", "60", "-D", str(self.data),
                  "-l", str(self.home / "server.log"),
                  "-o", f"-p {self.port} -k {self.home} -c listen_addresses={self.listen} "
                        "-c fsync=off -c max_connections=200")
        return self

    def stop(self, mode: str = "fast") -> None:
        self._run("pg_ctl", "stop", "-w", "-t", "60", "-m", mode, "-D", str(self.data))

    def restart(self, mode: str) -> None:
        """Stop (``fast``: sessions ended cleanly; ``immediate``: killed, crash recovery on
        start), then start again."""
        self.stop(mode)
        self.start()
        self.restarts += 1

    def destroy(self) -> None:
        """Stop the server if it runs, and remove its files (even if stopping failed)."""
        try:
            if (self.data / "postmaster.pid").exists():
                self.stop("immediate")
        finally:
            shutil.rmtree(self.home, ignore_errors=True)
