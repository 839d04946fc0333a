-- idem commit gate: the completion table (pggate, schema version 2).
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
    created_at  timestamptz NOT NULL DEFAULT now(),
    expires_at  timestamptz NOT NULL,              -- now() + the Executor's retention
    relayed     boolean     NOT NULL DEFAULT false, -- the store holds the completion
    progress    jsonb                               -- a multi-step request's recovery point while unfinished (Gate.Run), else NULL
);
-- Schema version 2: multi-step requests (tables made by version 1).
ALTER TABLE idem_completions ADD COLUMN IF NOT EXISTS progress jsonb;
-- The janitor deletes expired rows, oldest first.
CREATE INDEX IF NOT EXISTS idem_completions_expires_at ON idem_completions (expires_at);
-- The relay finds the rows the store may lack.
CREATE INDEX IF NOT EXISTS idem_completions_unrelayed ON idem_completions (created_at) WHERE NOT relayed;
-- The completer finds unfinished multi-step requests.
CREATE INDEX IF NOT EXISTS idem_completions_unfinished ON idem_completions (created_at) WHERE progress IS NOT NULL;
