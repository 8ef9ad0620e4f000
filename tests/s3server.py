"""Pytest plugin: a real S3 endpoint over HTTP for the whole session.

Load it with ``pytest_plugins = ["tests.s3server"]`` (or ``-p tests.s3server``).
If ``TENDON_TEST_S3_ENDPOINT_URL`` is set (e.g. a MinIO), that endpoint is used with
``TENDON_TEST_S3_BUCKET`` (default ``tendon-test``); otherwise moto's server runs in a thread on
127.0.0.1 for the session.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any

import boto3
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError

from infra.objects.s3 import S3ObjectStore

DEFAULT_BUCKET = "tendon-test"
REGION = "us-east-1"


@dataclass(frozen=True)
class S3Server:
    """Where the session's S3 lives, and the environment a child process needs to reach it."""

    endpoint_url: str
    bucket: str
    env: dict[str, str] = field(default_factory=dict)

    def client(self) -> Any:
        """A raw boto3 client on this endpoint (to inspect or tamper with objects)."""
        return boto3.session.Session().client(
            "s3",
            endpoint_url=self.endpoint_url,
            region_name=REGION,
            aws_access_key_id=self.env["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=self.env["AWS_SECRET_ACCESS_KEY"],
            config=Config(s3={"addressing_style": "path"}),
        )


def _env(endpoint_url: str, bucket: str, *, external: bool) -> dict[str, str]:
    key, secret = "testing", "testing"
    if external:  # a real MinIO may need real keys: take them from the environment if present
        key = os.environ.get("AWS_ACCESS_KEY_ID", key)
        secret = os.environ.get("AWS_SECRET_ACCESS_KEY", secret)
    return {
        "TENDON_S3_ENDPOINT_URL": endpoint_url,
        "TENDON_S3_BUCKET": bucket,
        "TENDON_S3_REGION": REGION,
        "AWS_ACCESS_KEY_ID": key,
        "AWS_SECRET_ACCESS_KEY": secret,
        "AWS_DEFAULT_REGION": REGION,
        # Without credentials boto3 would probe the EC2 metadata address; never leave loopback.
        "AWS_EC2_METADATA_DISABLED": "true",
    }


@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3Server]:
    """The session's S3 endpoint with its bucket created; also exports its env in this process."""
    external = os.environ.get("TENDON_TEST_S3_ENDPOINT_URL")
    moto = None
    if external:
        endpoint_url = external.rstrip("/")
        bucket = os.environ.get("TENDON_TEST_S3_BUCKET", DEFAULT_BUCKET)
    else:
        from moto.server import ThreadedMotoServer

        # Port 0: the OS picks a free port atomically, so parallel sessions never collide.
        moto = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        moto.start()
        host, port = moto.get_host_and_port()
        endpoint_url = f"http://{host}:{port}"
        bucket = DEFAULT_BUCKET
    server = S3Server(endpoint_url, bucket, _env(endpoint_url, bucket, external=bool(external)))
    # The S3ObjectStore reads credentials from the usual AWS variables: give them to this process
    # too, and put the previous values back at the end of the session.
    patch = pytest.MonkeyPatch()
    try:
        for name, value in server.env.items():
            patch.setenv(name, value)
        client = server.client()
        try:
            client.create_bucket(Bucket=bucket)
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") not in {
                "BucketAlreadyOwnedByYou",
                "BucketAlreadyExists",
            }:
                raise
        finally:
            client.close()
        yield server
    finally:
        patch.undo()
        if moto is not None:
            moto.stop()


@pytest.fixture
async def object_store(s3_server: S3Server) -> AsyncIterator[S3ObjectStore]:
    """An opened S3ObjectStore on the session's endpoint and bucket."""
    async with S3ObjectStore(bucket=s3_server.bucket, endpoint_url=s3_server.endpoint_url) as store:
        yield store
