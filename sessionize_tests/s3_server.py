"""A local S3-compatible server for the object-storage tests: moto's, from PyPI.

It runs in a process of its own: delta-rs keeps the GIL while it waits on the network, so a
server thread inside the test process would never answer it.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager

# What the server accepts: any key works, these are the tests' own.
ACCESS_KEY = "sessionize-test"
SECRET_KEY = "sessionize-test-secret"
REGION = "us-east-1"


@contextmanager
def s3_server(*, bucket: str) -> Iterator[str]:
    """Start a server with an empty `bucket`, point delta-rs and pyarrow at it through the
    environment (`AWS_*`, which they read), and yield its endpoint; stop it after."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    endpoint = f"http://127.0.0.1:{port}"
    server = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    environment = {
        "AWS_ACCESS_KEY_ID": ACCESS_KEY,
        "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
        "AWS_REGION": REGION,
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_ALLOW_HTTP": "true",  # delta-rs refuses plain HTTP unless told
    }
    previous = {key: os.environ.get(key) for key in environment}
    try:
        _wait_for(endpoint, server)
        urllib.request.urlopen(urllib.request.Request(f"{endpoint}/{bucket}", method="PUT"))
        os.environ.update(environment)
        yield endpoint
    finally:
        for key, value in previous.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        server.terminate()
        server.wait(timeout=30)


def spark_credentials() -> dict[str, str]:
    """The server's keys and region as Spark settings: a JVM started before `s3_server` set
    the environment does not see it."""
    return {
        "spark.hadoop.fs.s3a.access.key": ACCESS_KEY,
        "spark.hadoop.fs.s3a.secret.key": SECRET_KEY,
        "spark.hadoop.fs.s3a.endpoint.region": REGION,
    }


def _wait_for(endpoint: str, server: subprocess.Popen, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError(f"the S3 server exited with {server.returncode}")
        try:
            urllib.request.urlopen(endpoint, timeout=2)
            return
        except OSError:
            time.sleep(0.2)
    raise TimeoutError(f"the S3 server at {endpoint} did not answer in {timeout} s")
