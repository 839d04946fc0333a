-- idem transactional outbox: the outbox table (pgoutbox, schema version 1).
--
-- pgoutbox.Migrate runs this file. Teams with their own migration tool apply
-- it as it is; the table lives in the first schema of the connection's
-- search_path, next to the commit gate's idem_completions. One row per
-- message: Publish inserts it in the caller's transaction, the relay sends
-- it and marks it sent, the janitor deletes it after the retention.
CREATE TABLE IF NOT EXISTS idem_outbox (
    id          bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY, -- orders the rows of one key
    destination text        NOT NULL,               -- a name the relay routes to a broker destination
    key         text        NOT NULL,               -- the message's idempotency key (Idempotency-Key)
    payload     bytea       NOT NULL,
    headers     jsonb       NOT NULL DEFAULT '{}',  -- an object of strings
    created_at  timestamptz NOT NULL DEFAULT now(),
    attempts    integer     NOT NULL DEFAULT 0,     -- failed sends so far
    next_at     timestamptz NOT NULL DEFAULT now(), -- not sent before (set after a failed send)
    last_error  text,                               -- of the last failed send
    sent_at     timestamptz                         -- when the broker confirmed it; NULL until then
);
-- The relay takes the unsent rows in order.
CREATE INDEX IF NOT EXISTS idem_outbox_unsent ON idem_outbox (id) WHERE sent_at IS NULL;
-- The relay checks that no earlier row of the same destination and key is unsent.
CREATE INDEX IF NOT EXISTS idem_outbox_unsent_key ON idem_outbox (destination, key, id) WHERE sent_at IS NULL;
-- The janitor deletes sent rows, oldest first.
CREATE INDEX IF NOT EXISTS idem_outbox_sent ON idem_outbox (sent_at) WHERE sent_at IS NOT NULL;
