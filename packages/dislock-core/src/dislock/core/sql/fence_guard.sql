-- The fencing guard of one lock table: `dislockctl init --fencing` installs these two
-- functions beside the table, and `dislockctl fence` attaches them to a user's table
-- (dislock.core.fencing).  A transaction that writes to a guarded table commits only
-- while the setting dislock.fencing_token holds the token of a live lease of the
-- guarded lock key.  The functions run with their owner's rights (the lock table's
-- owner), so that a writer needs no right on the lock table; neither resolves a name
-- through the caller's search_path.

-- Called when a row of a guarded table changes, as its constraint trigger's WHEN:
-- true once per transaction and lock key, so that a 10,000-row COPY queues one check
-- for its commit, not 10,000.  The mark names the transaction, so that no setting of
-- the session's can stand for it; a rolled-back savepoint takes its mark back with
-- the check it queued.  Runs for every row: written to be inlined into the WHEN (no
-- SET clause, which would stop that), so every name in it, operators too, is
-- qualified instead of pinning search_path.
CREATE OR REPLACE FUNCTION {due}(lock_key text) RETURNS boolean
LANGUAGE sql VOLATILE AS $due$
    SELECT CASE
        WHEN pg_catalog.current_setting('dislock.fence_due', true) OPERATOR(pg_catalog.=)
            (pg_catalog.pg_current_xact_id()::pg_catalog.text
             OPERATOR(pg_catalog.||) ':' OPERATOR(pg_catalog.||) lock_key) THEN false
        ELSE pg_catalog.set_config(
            'dislock.fence_due',
            pg_catalog.pg_current_xact_id()::pg_catalog.text
                OPERATOR(pg_catalog.||) ':' OPERATOR(pg_catalog.||) lock_key,
            true
        ) IS NOT NULL
    END
$due$;

-- The check, at commit (a deferred constraint trigger) and before a TRUNCATE.  It
-- locks the live lease row it finds FOR SHARE: a takeover, a release or a renewal of
-- that row waits until this transaction has committed, which is a moment away, since
-- the check runs as the commit begins.  A lease that ended before the check
-- (expired, released, marked for a replacer or handed over to one, or taken over
-- with a newer token) refuses the commit.
CREATE OR REPLACE FUNCTION {guard}() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $guard$
DECLARE
    lock_key text := TG_ARGV[0];
    given text := pg_catalog.btrim(pg_catalog.current_setting('dislock.fencing_token', true));
    token bigint;
    what text := pg_catalog.format('%s on %I.%I', TG_OP, TG_TABLE_SCHEMA, TG_TABLE_NAME);
BEGIN
    IF given IS NULL OR given = '' THEN
        RAISE EXCEPTION USING ERRCODE = {sqlstate},
            MESSAGE = pg_catalog.format(
                'dislock fencing refused this %s: the transaction carries no fencing token'
                ' of lock %L (dislock.fencing_token is not set)', what, lock_key),
            HINT = {hint};
    END IF;
    IF given !~ '^[0-9]+$' OR pg_catalog.length(given) > 18 THEN
        RAISE EXCEPTION USING ERRCODE = {sqlstate},
            MESSAGE = pg_catalog.format(
                'dislock fencing refused this %s: dislock.fencing_token %L is not a fencing'
                ' token (a whole number)', what, pg_catalog.left(given, 40)),
            HINT = {hint};
    END IF;
    token := given::bigint;
    PERFORM FROM {table} AS held
     WHERE held.key = {lease_row} || lock_key
       AND held.fence = token AND held.expire_at > pg_catalog.clock_timestamp()
       AND pg_catalog.strpos(held.value, {replaced}) = 0
       AND pg_catalog.right(held.value, {handed_length}) <> {handed}
       FOR SHARE;
    IF NOT FOUND THEN
        -- The further slots of an N-holder lease (LOCK_SLOTS), only when the first
        -- is not this token's: one probe of the key's index each.
        PERFORM FROM {table} AS held
         WHERE held.key = ANY (ARRAY(
                SELECT {slot_row} || slot || ':' || lock_key
                  FROM pg_catalog.generate_series(2, {max_slots}) AS slot))
           AND held.fence = token AND held.expire_at > pg_catalog.clock_timestamp()
           AND pg_catalog.strpos(held.value, {replaced}) = 0
           AND pg_catalog.right(held.value, {handed_length}) <> {handed}
           FOR SHARE;
    END IF;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = {sqlstate},
            MESSAGE = pg_catalog.format(
                'dislock fencing refused this %s: fencing token %s is not that of a live'
                ' lease of lock %L (it expired, was released, replaced or taken over):'
                ' stop writing, the lock is gone', what, token, lock_key),
            HINT = 'Only the current holder of the lease writes; its wrapper has stopped'
                ' or will stop this run''s command.';
    END IF;
    RETURN NULL;
END
$guard$;

COMMENT ON FUNCTION {guard}() IS {version};
GRANT EXECUTE ON FUNCTION {due}(text) TO PUBLIC;
GRANT EXECUTE ON FUNCTION {guard}() TO PUBLIC;
