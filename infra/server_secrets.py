"""The secrets of the servers of ``make up``, generated once per run dir and kept in a file only
its owner can read (``secrets.json``, 0600, in the 0700 run dir beside ``services.json``).

- ``prefect_auth``: the Prefect API's basic-auth string (``PREFECT_SERVER_API_AUTH_STRING`` on
  the server, ``PREFECT_API_AUTH_STRING`` for its clients; the UI asks for it once);
- ``s3_access_key_id`` / ``s3_secret_access_key``: the key pair of the S3 endpoint (moto), which
  refuses requests signed with any other access key id.

Another local user can neither read the file nor list the run dir; a run dir or file owned by
someone else is refused (they could read, or chose, the secret).
"""

from __future__ import annotations

import json
import os
import secrets
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

SECRETS_FILE = "secrets.json"


class SecretsError(RuntimeError):
    """A secrets file or run dir this user cannot trust."""


@dataclass(kw_only=True, frozen=True, slots=True)
class ServerSecrets:
    prefect_auth: str
    s3_access_key_id: str
    s3_secret_access_key: str

    @classmethod
    def generate(cls) -> ServerSecrets:
        return cls(
            prefect_auth=f"vfm:{secrets.token_urlsafe(32)}",
            s3_access_key_id="VFM" + secrets.token_hex(9).upper(),  # 21 characters, AWS-like
            s3_secret_access_key=secrets.token_urlsafe(30),
        )


def private_dir(path: Path) -> Path:
    """``path`` created if missing, mode 0700, owned by this user (else :class:`SecretsError`)."""
    path.mkdir(parents=True, exist_ok=True)
    _own(path.stat().st_uid, path)
    os.chmod(path, 0o700)
    return path


def write_private(path: Path, text: str) -> None:
    """``text`` in ``path``, readable and writable by this user only (0600, also when it was
    there before with a wider mode)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        os.fchmod(f.fileno(), 0o600)
        f.write(text)


def server_secrets(run_dir: Path) -> ServerSecrets:
    """The secrets of ``run_dir/secrets.json``; generated and written (0600) the first time."""
    private_dir(run_dir)
    path = run_dir / SECRETS_FILE
    if not path.exists():  # written whole, then linked: of two `make up` at once, one wins
        fd, tmp = tempfile.mkstemp(dir=run_dir, prefix=".secrets-")
        with os.fdopen(fd, "w") as f:
            f.write(json.dumps(asdict(ServerSecrets.generate()), indent=1))
        try:
            os.link(tmp, path)
        except FileExistsError:
            pass
        finally:
            os.unlink(tmp)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        with os.fdopen(fd) as f:
            _own(os.fstat(f.fileno()).st_uid, path)
            os.fchmod(f.fileno(), 0o600)
            return ServerSecrets(**json.loads(f.read()))
    except (OSError, ValueError, TypeError) as e:
        raise SecretsError(f"{path}: not a secrets file ({e}); remove it and run `make up`") from e


def _own(uid: int, path: Path) -> None:
    if uid != os.geteuid():
        raise SecretsError(f"{path} belongs to uid {uid}, not to you: set VFM_INFRA_DIR")
