"""The thin HTTP layer: decode, authorize, call the domain and storage, encode."""
