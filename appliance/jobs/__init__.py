"""Background work inside the server process: the ticker and (later) the delivery worker."""
