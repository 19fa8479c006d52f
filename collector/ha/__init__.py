"""Active/standby collectors sharing one PostgreSQL: the leader lease and what only the leader
runs (see :mod:`.leadership` and ``docs/operations.md``, "Active/standby")."""
