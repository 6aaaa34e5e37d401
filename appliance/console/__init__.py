"""The admin console: server-rendered pages under /admin (routes.py), its sessions and CSRF
checks (session.py), templates/ and static/ (bundled in the binary by build.spec)."""
