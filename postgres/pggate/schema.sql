-- idem commit gate: the completion table (pggate, schema version 4).
--
-- Gate.Migrate runs this file. Teams with their own migration tool apply it
-- as it is; the table lives in the first schema of the connection's
-- search_path. One row per record digest: the database's unique key makes it
-- the final arbiter of which attempt's effect commits.
CREATE TABLE IF NOT EXISTS idem_completions (
    digest      text        NOT NULL PRIMARY KEY,  -- idem.Key.Digest, never the raw key
    fingerprint bytea       NOT NULL,              -- of the request that committed (any bytes)
    fence       bigint      NOT NULL,              -- of the attempt that committed
    result      bytea       NOT NULL,              -- the stored result, as the Executor encodes it
    created_at  timestamptz NOT NULL DEFAULT now(), -- when the row was written (the gate writes clock_timestamp()): the relay's order
    expires_at  timestamptz NOT NULL,              -- now() + the Executor's retention
    relayed     boolean     NOT NULL DEFAULT false, -- nothing to relay: the store got it in the transaction (pgstore), or the row is not a completion of the store's
    progress    jsonb                               -- a multi-step request's recovery point while unfinished (Gate.Run), else NULL
);
-- Schema version 2: multi-step requests (tables made by version 1).
ALTER TABLE idem_completions ADD COLUMN IF NOT EXISTS progress jsonb;
-- Schema version 3: the relay reads the rows in the order they were written,
-- from its cursor on, instead of marking each row relayed (a second write of
-- every row). The cursor is the last row it relayed; one row for the table.
CREATE INDEX IF NOT EXISTS idem_completions_created_at ON idem_completions (created_at);
CREATE TABLE IF NOT EXISTS idem_completions_relay (
    one         boolean     NOT NULL PRIMARY KEY DEFAULT true CHECK (one),
    created_at  timestamptz NOT NULL,  -- the cursor: the last row relayed,
    digest      text        NOT NULL   -- in the order (created_at, digest)
);
-- A table of version 2 starts the cursor before its oldest row not marked
-- relayed (through the index that goes next), a new table at now().
INSERT INTO idem_completions_relay (created_at, digest)
SELECT coalesce(min(created_at) - interval '1 microsecond', now()), '' FROM idem_completions WHERE NOT relayed
ON CONFLICT (one) DO NOTHING;
-- Version 2 found the rows by this index, whose predicate made every mark a
-- non-HOT update.
DROP INDEX IF EXISTS idem_completions_unrelayed;
-- Schema version 4: the janitor deletes expired rows in the order they were
-- written, through the relay's index on created_at; the index on expires_at
-- was a second B-tree entry for every row.
DROP INDEX IF EXISTS idem_completions_expires_at;
-- The completer finds unfinished multi-step requests.
CREATE INDEX IF NOT EXISTS idem_completions_unfinished ON idem_completions (created_at) WHERE progress IS NOT NULL;
