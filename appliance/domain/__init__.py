"""Pure logic: no I/O, no clocks read, no database. Functions over msgspec structs."""
