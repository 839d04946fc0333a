-- idem pgstore: the records table and its transitions (schema version 1).
--
-- Store.Migrate runs this file; teams with their own migration tool apply
-- it as it is. Objects live in the first schema of the connection's
-- search_path. Every transition of docs/design.md#the-state-machine is one
-- function, run in one round trip and atomic (row locks); times are the
-- server's clock (clock_timestamp) in µs. A record whose expires_at passed
-- is treated as absent; the janitor (Store.Sweep) deletes it later. States:
-- p in progress, c completed, r released, f failed.
CREATE TABLE IF NOT EXISTS idem_records (
    key         text   NOT NULL PRIMARY KEY,  -- idem.Key.Digest, never the raw key
    state       "char" NOT NULL,
    fingerprint bytea  NOT NULL,              -- any bytes (idemhttp's are a hash)
    owner       bytea  NOT NULL,              -- '' once the record left IN_PROGRESS
    fence       bigint NOT NULL,
    lease_until bigint NOT NULL,              -- µs; 0 unless IN_PROGRESS
    attempts    int    NOT NULL,
    created     bigint NOT NULL,              -- µs
    expires_at  bigint NOT NULL,              -- µs
    result      bytea
);
CREATE INDEX IF NOT EXISTS idem_records_expires_at ON idem_records (expires_at);

CREATE OR REPLACE FUNCTION idem_now() RETURNS bigint LANGUAGE sql VOLATILE AS
$$ SELECT (extract(epoch FROM clock_timestamp()) * 1000000)::bigint $$;

-- idem_acquire: Store.Acquire. code: 1 acquired (also a repeated call of
-- the same owner), 2 taken over, 3 in progress, 4 replay, 5 mismatch.
CREATE OR REPLACE FUNCTION idem_acquire(p_key text, p_fp bytea, p_owner bytea, p_lease bigint, p_retention bigint,
    p_max int, p_grace bigint,
    OUT code int, OUT fence bigint, OUT attempts int, OUT previous bytea, OUT left_us bigint, OUT state "char", OUT result bytea)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    now_us bigint := idem_now();
    r idem_records%ROWTYPE;
BEGIN
    -- Replays and mismatches, the most frequent duplicates, take no lock.
    SELECT * INTO r FROM idem_records WHERE idem_records.key = p_key;
    IF FOUND AND r.expires_at > now_us THEN
        IF r.fingerprint <> p_fp THEN
            code := 5; RETURN;
        END IF;
        IF r.state IN ('c', 'f') THEN
            code := 4; state := r.state; attempts := r.attempts; result := r.result; RETURN;
        END IF;
    END IF;
    LOOP
        INSERT INTO idem_records VALUES (p_key, 'p', p_fp, p_owner, now_us, now_us + p_lease, 1, now_us,
            now_us + 2 * p_lease + p_grace, NULL)
        ON CONFLICT DO NOTHING;
        IF FOUND THEN
            code := 1; fence := now_us; attempts := 1; RETURN;
        END IF;
        SELECT * INTO r FROM idem_records WHERE idem_records.key = p_key FOR UPDATE;
        EXIT WHEN FOUND; -- else deleted in between: insert again
    END LOOP;
    IF r.expires_at <= now_us THEN -- expired: a new record, the fence still grows
        fence := greatest(r.fence + 1, now_us);
        UPDATE idem_records SET state = 'p', fingerprint = p_fp, owner = p_owner, fence = idem_acquire.fence,
            lease_until = now_us + p_lease, attempts = 1, created = now_us,
            expires_at = now_us + 2 * p_lease + p_grace, result = NULL
        WHERE idem_records.key = p_key;
        code := 1; attempts := 1; RETURN;
    END IF;
    IF r.fingerprint <> p_fp THEN
        code := 5; RETURN;
    END IF;
    IF r.state IN ('c', 'f') THEN
        code := 4; state := r.state; attempts := r.attempts; result := r.result; RETURN;
    END IF;
    IF r.state = 'p' AND r.owner = p_owner THEN
        code := 1; fence := r.fence; attempts := r.attempts; RETURN;
    END IF;
    IF r.state = 'p' AND r.lease_until > now_us THEN
        code := 3; left_us := r.lease_until - now_us; attempts := r.attempts; RETURN;
    END IF;
    -- Released, or in progress with an expired lease.
    IF p_max > 0 AND r.attempts >= p_max THEN
        UPDATE idem_records SET state = 'f', owner = ''::bytea, lease_until = 0, result = NULL, expires_at = now_us + p_retention
        WHERE idem_records.key = p_key;
        code := 4; state := 'f'; attempts := r.attempts; RETURN;
    END IF;
    fence := greatest(r.fence + 1, now_us);
    attempts := r.attempts + 1;
    UPDATE idem_records SET state = 'p', owner = p_owner, fence = idem_acquire.fence, attempts = idem_acquire.attempts,
        lease_until = now_us + p_lease, expires_at = now_us + 2 * p_lease + p_grace, result = NULL
    WHERE idem_records.key = p_key;
    IF r.state = 'p' THEN
        code := 2; previous := r.owner;
    ELSE
        code := 1;
    END IF;
END $$;

-- idem_complete: Store.Complete, and pggate's completion inside the
-- caller's transaction. 1 done (also a repeated call), 0 lease lost.
CREATE OR REPLACE FUNCTION idem_complete(p_key text, p_owner bytea, p_fence bigint, p_result bytea, p_retention bigint,
    p_notify boolean) RETURNS int
LANGUAGE plpgsql AS $$
DECLARE
    now_us bigint := idem_now();
BEGIN
    UPDATE idem_records SET state = 'c', owner = ''::bytea, lease_until = 0, result = p_result, expires_at = now_us + p_retention
    WHERE key = p_key AND state = 'p' AND owner = p_owner AND fence = p_fence AND expires_at > now_us;
    IF FOUND THEN
        IF p_notify THEN PERFORM pg_notify('idem_records', p_key); END IF;
        RETURN 1;
    END IF;
    PERFORM 1 FROM idem_records WHERE key = p_key AND state = 'c' AND fence = p_fence AND result = p_result
        AND expires_at > now_us;
    RETURN CASE WHEN FOUND THEN 1 ELSE 0 END;
END $$;

-- idem_fail: Store.Fail. The state the record moved to ('r' or 'f'), or
-- '' when the lease is lost.
CREATE OR REPLACE FUNCTION idem_fail(p_key text, p_owner bytea, p_fence bigint, p_result bytea, p_terminal boolean,
    p_retention bigint, p_max int, p_notify boolean) RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    now_us bigint := idem_now();
    r idem_records%ROWTYPE;
    s "char";
BEGIN
    SELECT * INTO r FROM idem_records WHERE key = p_key AND expires_at > now_us FOR UPDATE;
    IF NOT FOUND THEN
        RETURN '';
    END IF;
    IF r.state IN ('r', 'f') AND r.fence = p_fence THEN
        RETURN r.state; -- a repeated call
    END IF;
    IF r.state <> 'p' OR r.owner <> p_owner OR r.fence <> p_fence THEN
        RETURN '';
    END IF;
    IF p_terminal OR (p_max > 0 AND r.attempts >= p_max) THEN
        s := 'f';
    ELSE
        s := 'r';
    END IF;
    UPDATE idem_records SET state = s, owner = ''::bytea, lease_until = 0, expires_at = now_us + p_retention,
        result = CASE WHEN s = 'f' THEN p_result END
    WHERE key = p_key;
    IF p_notify THEN PERFORM pg_notify('idem_records', p_key); END IF;
    RETURN s;
END $$;

-- idem_extend: Store.Extend. 1 done, 0 lease lost.
CREATE OR REPLACE FUNCTION idem_extend(p_key text, p_owner bytea, p_fence bigint, p_lease bigint, p_grace bigint) RETURNS int
LANGUAGE plpgsql AS $$
DECLARE
    now_us bigint := idem_now();
BEGIN
    UPDATE idem_records SET lease_until = now_us + p_lease, expires_at = now_us + 2 * p_lease + p_grace
    WHERE key = p_key AND state = 'p' AND owner = p_owner AND fence = p_fence AND expires_at > now_us;
    RETURN CASE WHEN FOUND THEN 1 ELSE 0 END;
END $$;

-- idem_release: Store.Release. 1 done (also a repeated call), 0 lease
-- lost.
CREATE OR REPLACE FUNCTION idem_release(p_key text, p_owner bytea, p_fence bigint, p_retention bigint, p_notify boolean)
RETURNS int
LANGUAGE plpgsql AS $$
DECLARE
    now_us bigint := idem_now();
BEGIN
    UPDATE idem_records SET state = 'r', owner = ''::bytea, lease_until = 0, result = NULL, expires_at = now_us + p_retention
    WHERE key = p_key AND state = 'p' AND owner = p_owner AND fence = p_fence AND expires_at > now_us;
    IF FOUND THEN
        IF p_notify THEN PERFORM pg_notify('idem_records', p_key); END IF;
        RETURN 1;
    END IF;
    PERFORM 1 FROM idem_records WHERE key = p_key AND state = 'r' AND fence = p_fence AND expires_at > now_us;
    RETURN CASE WHEN FOUND THEN 1 ELSE 0 END;
END $$;

-- idem_relay: idem.Relayer. The record becomes COMPLETED whatever its
-- state and owner; a live COMPLETED record is never changed. 1 written, 2
-- already completed.
CREATE OR REPLACE FUNCTION idem_relay(p_key text, p_fp bytea, p_fence bigint, p_result bytea, p_retention bigint,
    p_notify boolean) RETURNS int
LANGUAGE plpgsql AS $$
DECLARE
    now_us bigint := idem_now();
BEGIN
    INSERT INTO idem_records AS r VALUES (p_key, 'c', p_fp, ''::bytea, p_fence, 0, 1, now_us, now_us + p_retention, p_result)
    ON CONFLICT (key) DO UPDATE SET state = 'c', fingerprint = p_fp, owner = ''::bytea, lease_until = 0,
        fence = greatest(r.fence, p_fence), result = p_result, expires_at = now_us + p_retention,
        attempts = CASE WHEN r.expires_at > now_us THEN r.attempts ELSE 1 END,
        created = CASE WHEN r.expires_at > now_us THEN r.created ELSE now_us END
    WHERE r.state <> 'c' OR r.expires_at <= now_us;
    IF NOT FOUND THEN
        RETURN 2;
    END IF;
    IF p_notify THEN PERFORM pg_notify('idem_records', p_key); END IF;
    RETURN 1;
END $$;
