"""Fixtures for the shard / loader tests: real H.264 clips from the synthetic video generator
(images are one-frame clips) written as a curation-style ``clips.parquet``; a loopback S3 server."""

from __future__ import annotations

import os
from pathlib import Path

import pandas as pd
import pytest
from datagen import free_port, hash_embed, make_clips


@pytest.fixture(scope="session")
def clips_dir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("curated")
    make_clips(root, 24)
    return root


@pytest.fixture(scope="session")
def shard_dir(clips_dir, tmp_path_factory) -> Path:
    """24 samples in shards of ~20 kB (several shards)."""
    from vfm_core.data.shards import ShardWriterConfig, write_shards

    out = tmp_path_factory.mktemp("shards")
    df = pd.read_parquet(clips_dir / "clips.parquet")
    write_shards(
        df,
        str(out),
        embed=hash_embed,
        base_url=str(clips_dir),
        config=ShardWriterConfig(target_shard_bytes=20_000),
    )
    return out


@pytest.fixture(scope="session")
def s3_server():
    """moto's S3-protocol server on 127.0.0.1; s3fs reaches it through AWS_ENDPOINT_URL."""
    from moto.server import ThreadedMotoServer

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port)
    server.start()
    env = {
        "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}",
        "AWS_ACCESS_KEY_ID": "test",
        "AWS_SECRET_ACCESS_KEY": "test",
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    import boto3

    boto3.client("s3", endpoint_url=env["AWS_ENDPOINT_URL"]).create_bucket(Bucket="vfm")
    yield {"server": server, "port": port, **env}
    server.stop()
    for k, v in old.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
