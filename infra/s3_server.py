"""The S3 endpoint of ``make up``: moto's S3-protocol server without its admin API, for the
owner's key only.

    python infra/s3_server.py --host 127.0.0.1 --port 9000

- ``/moto-api/*`` (reset, seed, state, recorder, dashboard) answers 403: no process can wipe the
  store or read it back through moto's own admin endpoints;
- ``GET /vfm-health`` answers 200 without credentials (``make up``'s and ``make status``'s check);
- with ``VFM_S3_ACCESS_KEY_ID`` in the environment (``make up`` sets it from its 0600 secrets
  file), any other request must be an S3 request signed with that access key id (header or
  presigned URL, SigV4 or SigV2), else 403. moto does not verify signatures: the key id,
  readable by its owner only, is the secret;
- a ``Host`` header that is not a loopback name or the bound host answers 400 (DNS rebinding).
"""

from __future__ import annotations

import argparse
import hmac
import os
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from urllib.parse import parse_qs

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere
from infra.loopback import allowed_hosts  # noqa: E402

HEALTH = "/vfm-health"
ADMIN = "/moto-api"
KEY_VAR = "VFM_S3_ACCESS_KEY_ID"


def _host_name(header: str) -> str:
    """``Host`` without its port, lower case (``[::1]:9000`` -> ``[::1]``)."""
    if header.startswith("["):
        return header.split("]", 1)[0].lower() + "]"
    return header.rsplit(":", 1)[0].lower() if header.count(":") == 1 else header.lower()


def credential(environ: dict) -> tuple[str, str] | None:
    """(access key id, service) a signed request names, or None (unsigned, malformed): SigV4's
    ``Credential=KEY/DATE/REGION/SERVICE/aws4_request`` (header or presigned
    ``X-Amz-Credential``), or S3's SigV2 (``AWS KEY:SIGNATURE``, presigned ``AWSAccessKeyId``)."""
    auth = environ.get("HTTP_AUTHORIZATION", "")
    query = parse_qs(environ.get("QUERY_STRING", ""))
    if auth.startswith("AWS ") and ":" in auth:
        return auth[4:].split(":", 1)[0].strip(), "s3"
    if not auth and query.get("AWSAccessKeyId"):
        return query["AWSAccessKeyId"][0], "s3"
    if auth.startswith("AWS4-HMAC-SHA256 ") and "Credential=" in auth:
        scope = auth.split("Credential=", 1)[1].split(",", 1)[0].strip()
    else:
        scope = (query.get("X-Amz-Credential") or [""])[0]
    parts = scope.split("/")
    if len(parts) != 5 or parts[4] != "aws4_request":
        return None
    return parts[0], parts[3]


class Guard:
    """WSGI middleware in front of moto's app (see the module's docstring)."""

    def __init__(self, app: Callable, *, hosts: Iterable[str], access_key_id: str = "") -> None:
        self.app = app
        self.hosts = {h.lower() for h in hosts}
        self.access_key_id = access_key_id

    def __call__(self, environ: dict, start_response: Callable) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "")
        name = _host_name(environ.get("HTTP_HOST", ""))
        if name not in self.hosts and not name.endswith(".localhost"):
            return self._refuse(start_response, "400 Bad Request", "invalid host header")
        if path == HEALTH and environ.get("REQUEST_METHOD") in ("GET", "HEAD"):
            return self._refuse(start_response, "200 OK", "ok")
        if path == ADMIN or path.startswith(ADMIN + "/"):
            return self._refuse(start_response, "403 Forbidden", "moto's admin API is off")
        if self.access_key_id:
            found = credential(environ)
            key, service = found or ("", "")
            if service != "s3" or not hmac.compare_digest(key, self.access_key_id):
                return self._refuse(start_response, "403 Forbidden", "not signed with this key")
        return self.app(environ, start_response)

    @staticmethod
    def _refuse(start_response: Callable, status: str, text: str) -> list[bytes]:
        body = (text + "\n").encode()
        start_response(status, [("Content-Type", "text/plain"), ("Content-Length", str(len(body)))])
        return [body]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=9000)
    args = ap.parse_args(argv)
    os.environ.setdefault("MOTO_PORT", str(args.port))  # moto's presigned/redirect URLs

    from moto.moto_server.werkzeug_app import (
        DomainDispatcherApplication,
        MotoRequestHandler,
        create_backend_app,
    )
    from werkzeug.serving import run_simple

    app = Guard(
        DomainDispatcherApplication(create_backend_app),
        hosts=allowed_hosts(args.host),
        access_key_id=os.environ.get(KEY_VAR, ""),
    )
    run_simple(args.host, args.port, app, threaded=True, request_handler=MotoRequestHandler)
    return 0


if __name__ == "__main__":
    sys.exit(main())
