"""The PostgreSQL backend (`[storage] backend = "postgresql"`, docs/postgresql.md): the same store,
sessions and repositories as the SQLite one beside it.

- engine.py: the writer thread (group commit, units scoped by named advisory locks), the
  connection pool, readers, and the LISTEN/NOTIFY change signal.
- connection.py: a psycopg connection shaped like apsw's, so the repositories' standard SQL runs
  on both engines.
- repositories.py: the statements PostgreSQL spells differently, overridden per repository.
- leases.py: job leases, so a dead process's jobs are taken over and a live one's never.
- migrations.py: the SQLite migrations for PostgreSQL (and its own pgNN), and how they differ.
- store.py: PgStore and PgSession."""
