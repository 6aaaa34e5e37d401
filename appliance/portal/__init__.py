"""The portal under /portal: server-rendered pages for buyer and supplier users (docs/portal.md)."""
