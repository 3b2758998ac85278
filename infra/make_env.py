"""Write infra/.env: the compose stack's secrets, random, readable by the owner only.

docker compose reads this file (beside compose.yaml) for the ${...} values of the compose file:
the ledger owner's and the workers' PostgreSQL passwords and the Prefect API's basic-auth
string (the server's PREFECT_SERVER_API_AUTH_STRING and every client's PREFECT_API_AUTH_STRING).
It is listed in .gitignore and .dockerignore: never commit it, never bake it into an image.

    python infra/make_env.py [PATH] [--force]   ->  PATH (default infra/.env), mode 0600
"""

from __future__ import annotations

import os
import secrets
import sys
from pathlib import Path

DEFAULT_PATH = Path(__file__).resolve().parent / ".env"
PREFECT_USER = "admin"


def env_text() -> str:
    """The file's lines, with a fresh random value (128 bits, hex) for every secret."""
    return "\n".join([
        "# Secrets of infra/compose.yaml, made by `python infra/make_env.py`; never commit this.",
        f"LEDGER_DB_PASSWORD={secrets.token_hex(16)}",
        f"WORKER_DB_PASSWORD={secrets.token_hex(16)}",
        f"PREFECT_AUTH_STRING={PREFECT_USER}:{secrets.token_hex(16)}",
        "",
    ])


def write_env(path: Path, force: bool = False) -> bool:
    """Write ``path`` unless it exists (True when written); the file is created 0600."""
    if path.exists() and not force:
        return False
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(env_text())
    return True


def main(argv: list[str]) -> int:
    force = "--force" in argv
    args = [a for a in argv if a != "--force"]
    path = Path(args[0]) if args else DEFAULT_PATH
    if write_env(path, force):
        print(f"wrote {path} (mode 0600); the Prefect UI asks for the user and password of "
              "PREFECT_AUTH_STRING in it")
    else:
        print(f"{path} exists; kept it (--force replaces it, and then the PostgreSQL volume's "
              "passwords no longer match: `docker compose down -v` first)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
