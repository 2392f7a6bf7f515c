"""The Prefect server of ``make up``: Prefect's own app (API, UI, background services: scheduler,
automations, triggers) behind a Host-header check, served by uvicorn as ``prefect server start``
serves it (``prefect/cli/_server_utils.py``'s ``_run_in_foreground``).

    python infra/prefect_server.py --host 127.0.0.1 --port 4200

A request whose ``Host`` is not a loopback name (``127.0.0.1``, ``localhost``, ``[::1]``) or the
bound host (``VFM_HOST``) is answered 400: a web page that rebinds its own DNS name
to 127.0.0.1 cannot reach the API from a browser (``prefect server start`` has no such check).
Authentication (``PREFECT_SERVER_API_AUTH_STRING``) and CSRF protection
(``PREFECT_SERVER_API_CSRF_PROTECTION_ENABLED``) are Prefect's own, read from the environment.
The server's in-process clients (automation actions) call the inner app, not this wrapper.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere
from infra.loopback import allowed_hosts  # noqa: E402


def create(host: str):  # -> ASGI app
    """Prefect's final app wrapped in Starlette's ``TrustedHostMiddleware``."""
    from prefect.server.api.server import create_app
    from starlette.middleware.trustedhost import TrustedHostMiddleware

    return TrustedHostMiddleware(create_app(final=True), allowed_hosts=allowed_hosts(host))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=4200)
    args = ap.parse_args(argv)

    import prefect
    import uvicorn
    from prefect.settings import get_current_settings

    server = get_current_settings().server
    hosts = allowed_hosts(args.host)
    print(f"Prefect server on http://{args.host}:{args.port}, Host: {', '.join(hosts)}", flush=True)
    uvicorn.run(
        app=create(args.host),
        app_dir=str(prefect.__module_path__.parent),
        host=args.host,
        port=args.port,
        timeout_keep_alive=server.api.keepalive_timeout,
        ws_ping_interval=server.api.websocket_ping_interval,
        ws_ping_timeout=server.api.websocket_ping_timeout,
        log_level=server.logging_level.lower(),
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
