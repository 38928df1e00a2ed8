-- semel's outbox table, used by transactional mode and by anything that stages
-- messages (docs/outbox.md), for operators who create tables by hand.
-- `semel migrate` runs exactly these statements (tests/transactional/test_store.py
-- checks that they stay the same). For a table other than the default, set SEMEL_OUTBOX_TABLE
-- and replace semel_outbox below, index names included.
--
-- Staged messages are inserted here in the stager's transaction; the relay
-- publishes unsent rows and sets sent_at; the purge deletes rows sent longer
-- ago than SEMEL_RETENTION. The partial indexes stay small: two cover only
-- unsent rows, one only sent ones.

CREATE TABLE IF NOT EXISTS "semel_outbox" (
    id              bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,  -- relay order
    message_id      uuid        NOT NULL,     -- the AMQP message id and Idempotency-Key
    key             text        NOT NULL,     -- ordering group: the staging delivery's key, or the stager's group
    fence           bigint      NOT NULL,     -- the claim that committed it (0: staged by an application)
    exchange        text        NOT NULL,
    routing_key     text        NOT NULL,
    body            bytea       NOT NULL,
    content_type    text,
    headers         jsonb       NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT now(),
    attempts        integer     NOT NULL DEFAULT 0,      -- times the broker refused it
    next_attempt_at timestamptz NOT NULL DEFAULT now(),  -- a refused row waits until then
    last_error      text,                                -- why the broker refused it
    sent_at         timestamptz                          -- confirmed by the broker
);

CREATE INDEX IF NOT EXISTS "semel_outbox_unsent_idx" ON "semel_outbox" (id) WHERE sent_at IS NULL;

CREATE INDEX IF NOT EXISTS "semel_outbox_sent_at_idx" ON "semel_outbox" (sent_at) WHERE sent_at IS NOT NULL;

-- per-key ordering: the oldest unsent row of each group
CREATE INDEX IF NOT EXISTS "semel_outbox_key_unsent_idx" ON "semel_outbox" (key, id) WHERE sent_at IS NULL;
