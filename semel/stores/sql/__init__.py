"""What the SQL backends (SQLite and PostgreSQL) share: the statements that decide
a key (:mod:`semel.stores.sql.statements`). It imports no database driver."""
