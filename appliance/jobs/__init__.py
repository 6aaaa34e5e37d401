"""The background loops: the delivery worker, the webhook sender, the CSV imports a server runs
and the ticker."""
