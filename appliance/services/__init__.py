"""Use cases, one module per resource or flow: they take the runtime (its store) and the domain's
decisions, and are called by api/, jobs/ and the CLI alike."""
