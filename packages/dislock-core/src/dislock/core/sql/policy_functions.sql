-- The functions beside a granted lock table that its row-level security policies
-- call (dislock.core.policy_functions): written with a table's first grant and by
-- `dislockctl init --max-ttl`.  The maximum TTL is a literal in each: a policy cannot
-- read the table it guards.  Their bodies resolve no name through the caller's
-- search_path (a literal, or a search_path pinned to pg_catalog), so no role can make
-- them call a function of its own.

-- The table's maximum lease TTL as an interval: an immutable SQL function of one
-- literal, so the planner folds it into a constant (bounding a lease row costs a
-- comparison), and replacing it discards every cached plan that folded the old value.
-- (`interval '…'` is the type's keyword, not a name looked up.)
CREATE OR REPLACE FUNCTION {max_ttl}() RETURNS interval LANGUAGE sql IMMUTABLE
PARALLEL SAFE AS {max_ttl_body};

-- Whether a role may write a row it rarely writes, within its bounds.  Only rows that
-- none of the policy's LIKE patterns matched get this far, which in steady state is
-- none at all.  A further slot of the role's keys (slots: their regular expression)
-- ends within the maximum, as its first does; the timeline row only with the server's
-- real timeline, over a stale one (a role cannot forge a failover), noticed now
-- (every key's delay starts then: a role can neither end a delay early nor start one
-- late); the role's own TTL record, up to the maximum.  A scope row
-- (dislock.core.failover) is the grant's alone.
CREATE OR REPLACE FUNCTION {noting}(key text, value text, expire_at timestamptz,
    existing boolean, slots text) RETURNS boolean
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $noting$
BEGIN
    IF key ~ slots THEN
        RETURN existing OR expire_at <= NOW() + make_interval(secs => {cap});
    END IF;
    IF key = {timeline_key} THEN
        IF existing THEN RETURN value IS DISTINCT FROM {timeline}::text; END IF;
        RETURN value = {timeline}::text AND expire_at = NOW();
    END IF;
    IF key = {record} THEN RETURN existing OR value::float8 <= {cap}; END IF;
    RETURN false;
END
$noting$;

-- What grants wrote before per-key lock delays (the shortest delay a new timeline
-- could record), dropped after the function that called it was replaced.
DROP FUNCTION IF EXISTS {former_floor}();

-- (PUBLIC has EXECUTE by default, unless a hardened server revoked it.)
GRANT EXECUTE ON FUNCTION {max_ttl}() TO PUBLIC;
GRANT EXECUTE ON FUNCTION {noting}(text, text, timestamptz, boolean, text) TO PUBLIC;
