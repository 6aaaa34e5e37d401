"""The PostgreSQL backend (`[storage] backend = "postgresql"`, experimental): the same store,
sessions and repositories as the SQLite one beside it.

- engine.py: the connection pool, write units (serializable, run again on conflict), readers,
  and the LISTEN/NOTIFY change signal.
- connection.py: a psycopg connection shaped like apsw's, so the repositories' standard SQL runs
  on both engines.
- repositories.py: the statements PostgreSQL spells differently, overridden per repository.
- migrations.py: m001..m012 for PostgreSQL, and how they differ from SQLite's.
- store.py: PgStore and PgSession."""
