"""Credentials for a Prefect server: the header Prefect's own client sends, and what to say
when the server refuses them.

A self-hosted server with `PREFECT_SERVER_API_AUTH_STRING` set refuses every request
without `Authorization: Basic <user:password>` except `GET /health` and `/ready`.
"""

from __future__ import annotations

import base64

AUTH_HINT = ("set PREFECT_API_AUTH_STRING (user:password) where this runs to the server's "
             "PREFECT_SERVER_API_AUTH_STRING")


def configured_auth_string() -> str | None:
    """PREFECT_API_AUTH_STRING as Prefect reads it (environment, profile, temporary settings)."""
    from prefect.settings import PREFECT_API_AUTH_STRING

    return PREFECT_API_AUTH_STRING.value() or None


def auth_headers(auth_string: str | None = None) -> dict[str, str]:
    """`Authorization` as Prefect's client sends it: basic auth, else the API key (Cloud).

    `auth_string` defaults to PREFECT_API_AUTH_STRING.
    """
    from prefect.settings import PREFECT_API_KEY

    auth = auth_string if auth_string is not None else configured_auth_string()
    if auth:
        return {"Authorization": "Basic " + base64.b64encode(auth.encode()).decode()}
    key = PREFECT_API_KEY.value()
    return {"Authorization": f"Bearer {key}"} if key else {}


def credentials_problem(api_url: str, status: int) -> str:
    """Why a server answered 401/403: no credentials set, or the ones set are refused."""
    if not auth_headers():
        return (f"the Prefect server at {api_url} requires credentials (HTTP {status}) and "
                "none are set")
    return (f"the Prefect server at {api_url} refused the credentials in "
            f"PREFECT_API_AUTH_STRING (HTTP {status})")
