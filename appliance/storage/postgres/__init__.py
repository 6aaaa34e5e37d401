"""The PostgreSQL backend (`[storage] backend = "postgresql"`, docs/postgresql.md): the same store,
sessions and repositories as the SQLite one beside it.

- engine.py: the connection pool, write units (one at a time under the writer lock), readers,
  and the LISTEN/NOTIFY change signal.
- connection.py: a psycopg connection shaped like apsw's, so the repositories' standard SQL runs
  on both engines.
- repositories.py: the statements PostgreSQL spells differently, overridden per repository.
- leases.py: job leases, so a dead process's jobs are taken over and a live one's never.
- migrations.py: m001..m013 for PostgreSQL (and its own pgNN), and how they differ from SQLite's.
- store.py: PgStore and PgSession."""
