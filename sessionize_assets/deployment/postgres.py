"""The local Postgres a single-machine deployment keeps Dagster's storage in.

A cluster of its own in the deployment's folder (`<deploy>/postgres`), made on the first
`sessionize serve`: Debian's `postgresql` binaries (`make postgres` installs them), a superuser
with a password generated then and kept only in `<deploy>/postgres/credentials.json` (mode
0600; the folder is ignored by git), a `dagster` database, password authentication
(SCRAM), and the server listening on 127.0.0.1 alone: no Unix socket, no other interface.

Postgres refuses to run as root: as root, the cluster belongs to, and the server runs as, the
`postgres` account Debian's package creates, which must be able to reach the folder.
"""

from __future__ import annotations

import json
import os
import pwd
import secrets
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

# Debian installs each major version's server binaries here (`postgresql-<major>`), with only
# its client programs on the PATH.
DEBIAN_BINARIES = Path("/usr/lib/postgresql")
# The account the server runs as when sessionize runs as root (Debian's package creates it).
SERVER_ACCOUNT = "postgres"
SUPERUSER = "sessionize"
DATABASE = "dagster"
LOOPBACK = "127.0.0.1"


class PostgresError(RuntimeError):
    """The local cluster cannot be made or reached; the message says what to do."""


def server_binaries() -> Path:
    """The folder of the installed server's programs (`initdb`, `postgres`): the newest
    Debian version's, or wherever `initdb` is on the PATH."""
    versions = sorted(
        (p for p in DEBIAN_BINARIES.glob("*/bin") if (p / "initdb").is_file()),
        key=lambda p: int(p.parent.name) if p.parent.name.isdigit() else 0,
    )
    if versions:
        return versions[-1]
    on_path = shutil.which("initdb")
    if on_path:
        return Path(on_path).resolve().parent
    raise PostgresError(
        "no Postgres server installed (initdb not found): `make postgres` installs Debian's "
        "postgresql, or set DAGSTER_PG_URL to a Postgres of your own"
    )


@dataclass(frozen=True, kw_only=True)
class Credentials:
    """How Dagster reaches the local cluster."""

    user: str
    password: str
    port: int

    @property
    def url(self) -> str:
        """The `postgresql://` URL of the `dagster` database (it holds the password)."""
        return (
            f"postgresql://{quote(self.user)}:{quote(self.password, safe='')}"
            f"@{LOOPBACK}:{self.port}/{DATABASE}"
        )


class LocalPostgres:
    """The cluster in `folder`: its data (`data/`), its credentials and its server's log."""

    def __init__(self, folder: Path, *, port: int) -> None:
        self.folder = folder.absolute()
        self.data = self.folder / "data"
        self.credentials_file = self.folder / "credentials.json"
        self.port = port

    @property
    def account(self) -> str | None:
        """The account the server runs as: None (this process's) unless this one is root."""
        return SERVER_ACCOUNT if os.geteuid() == 0 else None

    def ensure(self) -> Credentials:
        """Make the cluster and its database on first use; return its credentials, with the
        port set now (a cluster keeps its data, not its port: that is the server's command)."""
        if not (self.data / "PG_VERSION").is_file():
            self._make()
        stored = json.loads(self.credentials_file.read_text())
        return Credentials(user=stored["user"], password=stored["password"], port=self.port)

    def server_command(self) -> list[str]:
        """The server in the foreground (a supervisor's program): loopback TCP only."""
        return [
            str(server_binaries() / "postgres"),
            "-D",
            str(self.data),
            "-c",
            f"listen_addresses={LOOPBACK}",
            "-c",
            f"port={self.port}",
            "-c",
            "unix_socket_directories=",
        ]

    def _make(self) -> None:
        binaries = server_binaries()
        if self.folder.exists():
            # A cluster that never finished being made: start it again from nothing.
            shutil.rmtree(self.folder)
        self.folder.mkdir(parents=True, mode=0o700)
        password = secrets.token_urlsafe(24)
        self.credentials_file.touch(mode=0o600)
        self.credentials_file.write_text(json.dumps({"user": SUPERUSER, "password": password}))
        work = self.folder / "setup"
        work.mkdir(mode=0o700)
        password_file = work / "password"
        password_file.write_text(password + "\n")
        account = self.account
        if account is not None:
            self._hand_to(account, [self.folder, work, password_file])
        try:
            self._run(
                [
                    str(binaries / "initdb"),
                    "-D",
                    str(self.data),
                    "-U",
                    SUPERUSER,
                    f"--pwfile={password_file}",
                    "--auth=scram-sha-256",
                    "--encoding=UTF8",
                    "--no-instructions",
                ],
            )
            # The database, made by the server in single-user mode: nothing listens meanwhile.
            self._run(
                [str(binaries / "postgres"), "--single", "-D", str(self.data), "postgres"],
                stdin=f'CREATE DATABASE "{DATABASE}";\n',
            )
        finally:
            shutil.rmtree(work)

    def _hand_to(self, account: str, paths: list[Path]) -> None:
        """Give `account` the cluster's folder (as root), after checking it can reach it."""
        entry = pwd.getpwnam(account)
        for parent in self.folder.parents:
            if not os.stat(parent).st_mode & 0o001:
                raise PostgresError(
                    f"Postgres runs as {account!r} (sessionize runs as root), which cannot reach "
                    f"{self.folder}: {parent} is not searchable by others; put the deployment "
                    "(SESSIONIZE_DEPLOY_DIR) where it can"
                )
        for path in paths:
            os.chown(path, entry.pw_uid, entry.pw_gid)

    def _run(self, command: list[str], *, stdin: str | None = None) -> None:
        done = subprocess.run(
            command,
            input=stdin,
            capture_output=True,
            text=True,
            user=self.account,
            cwd=self.folder,
            check=False,
        )
        if done.returncode != 0:
            raise PostgresError(
                f"{Path(command[0]).name} failed ({done.returncode}) making the cluster in "
                f"{self.data}: {(done.stderr or done.stdout).strip()[-1000:]}"
            )
