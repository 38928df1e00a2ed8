-- semel's outbox table, used in transactional mode (SEMEL_TRANSACTIONAL=true), for
-- operators who create tables by hand. `semel migrate` runs exactly these
-- statements in that mode (tests/transactional/test_store.py checks that they
-- stay the same). For a table other than the default, set SEMEL_OUTBOX_TABLE
-- and replace semel_outbox below, index names included.
--
-- A handler's staged messages are inserted here in its transaction; the relay
-- publishes unsent rows and sets sent_at; the purge deletes rows sent longer
-- ago than SEMEL_RETENTION. Both partial indexes stay small: the first covers
-- only unsent rows, the second only sent ones.

CREATE TABLE IF NOT EXISTS "semel_outbox" (
    id              bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,  -- relay order
    message_id      uuid        NOT NULL,     -- the AMQP message id and Idempotency-Key
    key             text        NOT NULL,     -- SEMEL_KEY_PREFIX:key of the delivery that staged it
    fence           bigint      NOT NULL,     -- the claim that committed it
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
