-- semel's PostgreSQL idempotency store, for operators who create tables by hand.
-- `semel migrate` runs exactly these statements (tests/stores/test_postgres.py
-- checks that they stay the same). For a table other than the default, set
-- SEMEL_POSTGRES_TABLE and replace semel_keys below, index name included.
--
-- All times come from the server's now(). A row past expires_at counts as
-- absent; the store's purge deletes such rows in batches through the index.

CREATE TABLE IF NOT EXISTS "semel_keys" (
    key             text        PRIMARY KEY,  -- SEMEL_KEY_PREFIX:idempotency key
    fingerprint     text        NOT NULL,     -- hash of the canonical JSON body
    status          text        NOT NULL CHECK (status IN ('in_progress', 'completed', 'failed')),
    fence           bigint      NOT NULL,     -- grows with every claim of the key
    claims          integer     NOT NULL,     -- claims since the last completion or reset
    lock_expires_at timestamptz,              -- end of the current lease
    result          jsonb,                    -- the handler's result, once completed
    error           text,                     -- why it failed, once failed
    first_seen      timestamptz NOT NULL,
    updated_at      timestamptz NOT NULL,
    expires_at      timestamptz NOT NULL      -- end of retention
);

CREATE INDEX IF NOT EXISTS "semel_keys_expires_at_idx" ON "semel_keys" (expires_at);
