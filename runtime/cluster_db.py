"""The Temporal cluster's own PostgreSQL: a private Debian PostgreSQL 15 in a state dir, run as the postgres user."""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
from pathlib import Path

from activities.errors import ColdstartError
from runtime.postgres import PG_BIN, as_postgres

__all__ = ["ClusterDatabase", "DatabaseError"]

_SUPERUSER = "postgres"


class DatabaseError(ColdstartError, RuntimeError):
    pass


class ClusterDatabase:
    """initdb once into `root`, then pg_ctl start/stop; stop() keeps the data for the next start().

    Only loopback TCP with a password (scram-sha-256) is open, and only to the Temporal role; the
    superuser logs in by peer over a socket inside the state dir, for creating that role.
    """

    def __init__(self, root: Path):
        self.root = Path(root)
        self.data = self.root / "data"
        self.socket_dir = self.root / "run"
        self.log = self.root / "postgres.log"
        self.port = 5432  # set by start()

    def _run(self, argv: list[str], *, input: str | None = None, timeout: float = 60.0,
             check: bool = True) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(as_postgres(argv), input=input, capture_output=True, text=True, timeout=timeout,
                              cwd=self.root, check=False,
                              start_new_session=True)  # the server outlives a Ctrl-C meant for us
        if check and proc.returncode != 0:
            raise DatabaseError(f"{Path(argv[0]).name} {argv[1] if len(argv) > 1 else ''} -> rc={proc.returncode}: "
                                f"{(proc.stderr or proc.stdout).strip()} (log {self.log})")
        return proc

    def create(self) -> bool:
        """Create the cluster once; False when it already exists (a half-made one is made again)."""
        if (self.data / "PG_VERSION").exists():
            return False
        if not (PG_BIN / "initdb").exists():
            raise DatabaseError(f"{PG_BIN}/initdb not found: install the Debian package postgresql (15)")
        # A socket path is limited to 107 bytes; say so instead of postgres failing obscurely.
        if len(str(self.socket_dir / ".s.PGSQL.65535")) > 100:
            raise DatabaseError(f"state dir path too long for a PostgreSQL socket: {self.socket_dir}")
        pw = pwd.getpwnam(_SUPERUSER)
        for path in (self.root, self.socket_dir):
            path.mkdir(parents=True, exist_ok=True)
            os.chown(path, pw.pw_uid, pw.pw_gid)
            os.chmod(path, 0o700)
        shutil.rmtree(self.data, ignore_errors=True)
        self._run([str(PG_BIN / "initdb"), "-D", str(self.data), "-U", _SUPERUSER, "-E", "UTF8",
                   "--auth-local=peer", "--auth-host=scram-sha-256", "--no-instructions"], timeout=180)
        (self.data / "pg_hba.conf").write_text(
            f"local all {_SUPERUSER} peer\nhost all all 127.0.0.1/32 scram-sha-256\n")
        with (self.data / "postgresql.conf").open("a") as conf:
            conf.write("include_if_exists = 'coldstart.conf'\n")
        return True

    def running(self) -> bool:
        return self._run([str(PG_BIN / "pg_ctl"), "status", "-D", str(self.data)], check=False).returncode == 0

    def start(self, port: int) -> None:
        """Start on 127.0.0.1:port (idempotent: a running server, started on the same port, is left as it is)."""
        self.port = port
        if self.running():
            return
        settings = {
            "listen_addresses": "127.0.0.1", "port": port, "unix_socket_directories": str(self.socket_dir),
            # Temporal's services hold pools of their own (config: maxConns per store and service).
            "max_connections": 200, "password_encryption": "scram-sha-256",
        }
        conf = self.data / "coldstart.conf"
        conf.write_text("".join(f"{k} = '{v}'\n" for k, v in settings.items()))
        pw = pwd.getpwnam(_SUPERUSER)
        os.chown(conf, pw.pw_uid, pw.pw_gid)
        self._run([str(PG_BIN / "pg_ctl"), "start", "-D", str(self.data), "-l", str(self.log), "-w", "-t", "60"],
                  timeout=90)

    def stop(self) -> None:
        """Fast shutdown (open transactions roll back, the data is consistent); nothing to do when down."""
        if (self.data / "PG_VERSION").exists() and self.running():
            self._run([str(PG_BIN / "pg_ctl"), "stop", "-D", str(self.data), "-m", "fast", "-w", "-t", "60"],
                      timeout=90)

    def sql(self, statement: str, database: str = "postgres") -> str:
        """Run SQL as the superuser over the private socket (statement on stdin, not in argv); rows as text."""
        return self._run([str(PG_BIN / "psql"), "-h", str(self.socket_dir), "-p", str(self.port), "-U", _SUPERUSER, "-d", database,
                          "-X", "-q", "-t", "-A", "-v", "ON_ERROR_STOP=1"], input=statement).stdout.strip()

    def ensure_role(self, user: str, password: str) -> None:
        """A login role that may create databases, with this password (set again on every start)."""
        if not (user.isidentifier() and password.isalnum()):
            raise DatabaseError("role names are identifiers and passwords alphanumeric (they go into SQL)")
        self.sql(f"DO $$ BEGIN IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '{user}') THEN "
                 f"CREATE ROLE {user} LOGIN CREATEDB; END IF; END $$;\n"
                 f"ALTER ROLE {user} PASSWORD '{password}';\n")

    def has_database(self, name: str) -> bool:
        return self.sql(f"SELECT 1 FROM pg_database WHERE datname = '{name}'") == "1"
