"""A real PostgreSQL server for the tests, on loopback, in a temporary folder: Debian's ``postgresql`` binaries
(``.ci/run`` installs them), ``initdb`` as the ``postgres`` user when the tests run as root (PostgreSQL refuses
to run as root), a role with a password (scram-sha-256 over TCP), and ``pg_ctl stop`` at the end."""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import subprocess
from dataclasses import dataclass
from pathlib import Path

#: The password of the test role: it must never appear in sweeper's output or files.
PASSWORD = "s3cret-Pg@ss:word"


def pg_bin() -> Path | None:
    """The folder of ``initdb``/``pg_ctl``: Debian's /usr/lib/postgresql/<major>/bin, or on PATH; None if absent."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    if found:
        return Path(found[-1]).parent
    initdb = shutil.which("initdb")
    return Path(initdb).parent if initdb else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class PgServer:
    folder: Path
    port: int
    bin: Path
    user: str | None  # who runs the server when the tests run as root

    @property
    def url(self) -> str:
        return f"postgresql://sweeper:{PASSWORD.replace('@', '%40').replace(':', '%3A')}@127.0.0.1:{self.port}/sweeper"

    def _run(self, *args: object) -> subprocess.CompletedProcess[str]:
        cmd = [str(a) for a in args]
        if self.user is not None:
            entry = pwd.getpwnam(self.user)
            cmd = ["setpriv", f"--reuid={entry.pw_uid}", f"--regid={entry.pw_gid}", "--clear-groups", *cmd]
        return subprocess.run(
            cmd, capture_output=True, text=True, timeout=120, check=True, env={**os.environ, "LC_ALL": "C"}
        )

    def start(self) -> None:
        data = self.folder / "data"
        self._run(
            self.bin / "initdb",
            "-D",
            data,
            "-U",
            "postgres",
            "-E",
            "UTF8",
            "--locale=C",
            "--auth-local=trust",
            "--auth-host=scram-sha-256",
        )
        self._run(
            self.bin / "pg_ctl",
            "-D",
            data,
            "-l",
            self.folder / "server.log",
            "-w",
            "-t",
            "60",
            "-o",
            f"-c listen_addresses=127.0.0.1 -c port={self.port} -c unix_socket_directories={self.folder}"
            " -c max_connections=100 -c fsync=off",
            "start",
        )
        psql = [self.bin / "psql", "-h", self.folder, "-p", str(self.port), "-U", "postgres", "-v", "ON_ERROR_STOP=1"]
        self._run(*psql, "-c", f"CREATE ROLE sweeper LOGIN PASSWORD '{PASSWORD}'")
        self._run(*psql, "-c", "CREATE DATABASE sweeper OWNER sweeper")

    def stop(self) -> None:
        try:
            self._run(self.bin / "pg_ctl", "-D", self.folder / "data", "-m", "immediate", "stop")
        except subprocess.CalledProcessError:
            pass


def start_server(folder: Path) -> PgServer:
    """Start a server in ``folder`` (made readable by the server's user) and return it; raises RuntimeError when the
    binaries are missing."""
    bin_dir = pg_bin()
    if bin_dir is None:
        raise RuntimeError("PostgreSQL is not installed (Debian: apt-get install postgresql; .ci/run does this)")
    user = None
    if os.geteuid() == 0:
        user = "postgres"
        entry = pwd.getpwnam(user)
        os.chown(folder, entry.pw_uid, entry.pw_gid)
        for parent in folder.parents:  # the server must be able to reach its folder
            os.chmod(parent, os.stat(parent).st_mode | 0o011) if parent != Path("/") else None
    server = PgServer(folder=folder, port=_free_port(), bin=bin_dir, user=user)
    server.start()
    return server
