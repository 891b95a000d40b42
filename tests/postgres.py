"""A real PostgreSQL server for the tests, started from the system's server binaries.

    server = PostgresServer.start()      # initdb + postgres on 127.0.0.1, a free port, a tmp dir
    url = server.new_database()          # postgresql://postgres@127.0.0.1:PORT/test_3
    server.stop(); server.restart()      # an outage (the data is kept)
    server.shutdown()                    # stop and remove everything

The binaries are looked for in `$FITKIT_PG_BIN`, then /usr/lib/postgresql/*/bin, then on PATH.
PostgreSQL refuses to run as root: as root, the server runs as the `postgres` system user.
"""

from __future__ import annotations

import glob
import itertools
import os
import pwd
import shutil
import socket
import subprocess
import tempfile


def find_binaries() -> str | None:
    """The folder holding `initdb` and `pg_ctl`, or None."""
    candidates = [os.environ.get("FITKIT_PG_BIN", "")]
    candidates += sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True)
    on_path = shutil.which("pg_ctl")
    candidates.append(os.path.dirname(on_path) if on_path else "")
    for folder in candidates:
        if folder and all(os.access(os.path.join(folder, b), os.X_OK) for b in ("initdb", "pg_ctl", "postgres")):
            return folder
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PostgresServer:
    def __init__(self, bin_dir: str, root: str, port: int, user: str | None):
        self.bin_dir, self.root, self.port, self.user = bin_dir, root, port, user
        self.data = os.path.join(root, "data")
        self._names = itertools.count()

    @classmethod
    def start(cls) -> PostgresServer:
        bin_dir = find_binaries()
        if bin_dir is None:
            raise FileNotFoundError("no PostgreSQL server binaries (initdb, pg_ctl, postgres) found in "
                                    "/usr/lib/postgresql/*/bin or on PATH; set FITKIT_PG_BIN")
        root = tempfile.mkdtemp(prefix="fitkit-pg-")
        user = None
        if os.geteuid() == 0:  # postgres refuses root: run it as the postgres system user
            try:
                entry = pwd.getpwnam("postgres")
            except KeyError as error:
                raise FileNotFoundError("running as root and there is no `postgres` user to run the server") from error
            os.chmod(root, 0o755)
            os.chown(root, entry.pw_uid, entry.pw_gid)
            user = "postgres"
        server = cls(bin_dir, root, _free_port(), user)
        server._run("initdb", "-D", server.data, "-A", "trust", "-U", "postgres", "--no-sync", "-E", "UTF8")
        server.restart()
        return server

    def _run(self, program: str, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        command = [os.path.join(self.bin_dir, program), *args]
        if self.user:
            command = ["runuser", "-u", self.user, "--", *command]
        return subprocess.run(command, cwd=self.root, capture_output=True, text=True, check=check, timeout=120)

    def restart(self) -> None:
        """Start the server (again), waiting until it accepts connections."""
        options = (f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c fsync=off "
                   "-c synchronous_commit=off -c full_page_writes=off -c max_connections=100")
        self._run("pg_ctl", "-D", self.data, "-o", options, "-l", os.path.join(self.root, "log"), "-w", "-t", "60",
                  "start")

    def stop(self) -> None:
        """Stop the server now (open connections are cut); `restart()` brings it back."""
        self._run("pg_ctl", "-D", self.data, "-m", "fast", "-w", "stop", check=False)

    def shutdown(self) -> None:
        self._run("pg_ctl", "-D", self.data, "-m", "immediate", "-w", "stop", check=False)
        shutil.rmtree(self.root, ignore_errors=True)

    def url(self, database: str = "postgres") -> str:
        return f"postgresql+psycopg2://postgres@127.0.0.1:{self.port}/{database}"

    def new_database(self) -> str:
        """A fresh, empty database; its URL."""
        import psycopg2

        name = f"test_{os.getpid()}_{next(self._names)}"
        connection = psycopg2.connect(host="127.0.0.1", port=self.port, user="postgres", dbname="postgres",
                                      connect_timeout=10)
        try:
            connection.autocommit = True
            with connection.cursor() as cursor:
                cursor.execute(f'CREATE DATABASE "{name}"')
        finally:
            connection.close()
        return self.url(name)
