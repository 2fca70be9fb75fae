"""The Prefect server dyngen starts for you: local (SQLite or PostgreSQL), with basic auth.

`local` starts and stops a server (and the temporary one a round without PREFECT_API_URL
needs), `postgres` a local PostgreSQL cluster for it, `auth` the credentials clients send,
`processes` the child processes we own and stop by PID.
"""
