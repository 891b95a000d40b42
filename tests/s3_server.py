"""A real S3 server on loopback for the object-storage tests: moto's server mode, spoken to
through s3fs as a user's run would (credentials and endpoint from the environment).

    server = S3Server.start()          # 127.0.0.1:<free port>; AWS_* set in os.environ
    server.bucket("ckpts")             # a fresh bucket: "s3://ckpts"
    server.stop(); server.restart()    # the endpoint down, then back with its objects

The server runs in the test process, so stopping and starting it again keeps the objects (moto's
state lives in the process), as a real endpoint that stops answering for a while would.
"""

from __future__ import annotations

import logging
import os
import uuid


class S3Server:
    def __init__(self, server, port: int) -> None:
        self.server, self.port = server, port

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def env(self) -> dict[str, str]:
        """What a process needs to reach it (credentials moto accepts, the endpoint)."""
        return {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
                "AWS_ENDPOINT_URL": self.endpoint}

    @classmethod
    def start(cls) -> S3Server:
        from moto.server import ThreadedMotoServer

        logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one line per request otherwise
        server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        server.start()
        found = cls(server, server.get_host_and_port()[1])
        os.environ.update(found.env)
        return found

    def stop(self) -> None:
        self.server.stop()

    def restart(self) -> None:
        from moto.server import ThreadedMotoServer

        self.server = ThreadedMotoServer(ip_address="127.0.0.1", port=self.port, verbose=False)
        self.server.start()

    @staticmethod
    def fs():
        import fsspec

        fs = fsspec.filesystem("s3")
        fs.invalidate_cache()
        return fs

    def bucket(self, prefix: str = "fitkit") -> str:
        """A new, empty bucket's URL."""
        name = f"{prefix}-{uuid.uuid4().hex[:10]}"
        self.fs().mkdir(name)
        return f"s3://{name}"

    def keys(self, url: str) -> list[str]:
        """Every object under `url`, relative to it."""
        fs, root = self.fs(), url[len("s3://"):].rstrip("/")
        return sorted(k[len(root) + 1:] for k in fs.find(root))
