-- The fencing guard of one lock table: `dislockctl init --fencing` installs these two
-- functions beside the table, and `dislockctl fence` attaches them to a user's table
-- (dislock.core.fencing).  A transaction that writes to a guarded table commits only
-- while the setting dislock.fencing_token holds the token of a live lease of the
-- guarded lock key.  The functions run with their owner's rights (the lock table's
-- owner), so that a writer needs no right on the lock table; neither resolves a name
-- through the caller's search_path.

-- What the WHEN of a trigger made by an earlier `fence` calls: it marked the first row
-- of a transaction in a session setting, which a writer could set itself to skip the
-- check (#61, N4).  Now true for every row: each queues its check.  (Inlined into the
-- WHEN, so every name in it is qualified.)
CREATE OR REPLACE FUNCTION {due}(lock_key text) RETURNS boolean
LANGUAGE sql IMMUTABLE AS $due$ SELECT true $due$;

-- The check, at commit (a deferred constraint trigger, once per changed row) and
-- before a TRUNCATE.  It runs only where `fence` put it: a trigger of its name on a
-- table whose owner may lock the key (the lock table's owner or a member, a superuser,
-- a role whose grant covers the key; any role while the lock table has no grants),
-- so that no role can make it read another team's lease rows from a table of its
-- own.  It takes no row lock: a lock held until the writer's transaction ends
-- would let any transaction left open hold up the renewal and the takeover of the
-- lease (#61, N1).  So a takeover between the check and the commit's end is not seen
-- (docs/fencing.md, "What it guarantees").  A lease that ended before the check
-- (expired, released, marked for a replacer or handed over to one, or taken over
-- with a newer token) refuses the commit.
CREATE OR REPLACE FUNCTION {guard}() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $guard$
DECLARE
    lock_key text := TG_ARGV[0];
    given text := pg_catalog.btrim(pg_catalog.current_setting('dislock.fencing_token', true));
    token bigint;
    what text := pg_catalog.format('%s on %I.%I', TG_OP, TG_TABLE_SCHEMA, TG_TABLE_NAME);
    v_owner oid := (SELECT c.relowner FROM pg_class AS c WHERE c.oid = TG_RELID);
    v_table pg_class%ROWTYPE;
BEGIN
    SELECT * INTO v_table FROM pg_class AS c WHERE c.oid = {table_oid};
    IF TG_NAME NOT IN ({triggers}) OR TG_NARGS <> 1 OR NOT (
        NOT v_table.relrowsecurity OR pg_has_role(v_owner, v_table.relowner, 'MEMBER')
        OR EXISTS (SELECT FROM pg_roles AS r
                   WHERE r.oid = v_owner AND (r.rolsuper OR r.rolbypassrls))
        OR EXISTS (SELECT FROM pg_roles AS r
                   JOIN {table} AS s ON s.key = {scope_prefix} || r.rolname::text COLLATE "default"
                   WHERE pg_has_role(v_owner, r.oid, 'MEMBER') AND lock_key ~ s.value))
    THEN
        RAISE EXCEPTION USING ERRCODE = {sqlstate},
            MESSAGE = pg_catalog.format(
                'dislock fencing refused this %s: its guard by lock %L was not attached by'
                ' dislockctl fence (the table''s owner may not lock that key)', what, lock_key);
    END IF;
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
       AND pg_catalog.right(held.value, {handed_length}) <> {handed};
    IF NOT FOUND THEN
        -- The further slots of an N-holder lease (LOCK_SLOTS), only when the first
        -- is not this token's: one probe of the key's index each.
        PERFORM FROM {table} AS held
         WHERE held.key = ANY (ARRAY(
                SELECT {slot_row} || slot || ':' || lock_key
                  FROM pg_catalog.generate_series(2, {max_slots}) AS slot))
           AND held.fence = token AND held.expire_at > pg_catalog.clock_timestamp()
           AND pg_catalog.strpos(held.value, {replaced}) = 0
           AND pg_catalog.right(held.value, {handed_length}) <> {handed};
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
-- (Any role may attach it: it runs only where `fence` could have attached it.)
GRANT EXECUTE ON FUNCTION {guard}() TO PUBLIC;
