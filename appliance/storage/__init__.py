"""Everything that touches the database lives below this package; no SQL anywhere else."""
