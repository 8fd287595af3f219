-- The lock protocol of one lock table, as functions beside it (dislock.core.protocol):
-- `dislockctl init` installs them, and the lock code calls them instead of sending
-- the statements of dislock.core.lock_queries, which they answer exactly as.
--
-- Why functions: a statement is planned on every execution, and an acquisition's
-- single statement (the lock delay, the pause, the TTL cap and the upsert, nine
-- tables in one plan) cost more to plan than to run.  A PL/pgSQL function runs short
-- statements, each planned once per server session and then kept (behind PgBouncer
-- too), and the common refusal, a live row, stops after primary-key reads.
--
-- Who may do what is decided in one place, {caller}: the functions a team calls run
-- as the table's owner (SECURITY DEFINER), so that a team of `dislockctl grant` needs
-- no right to write either table.  The hot three (acquire, renew, release) first ask
-- whether the session's role is a member of the role they run as, which `init` makes
-- the table's owner: such a session may lock any key, and a fresh one then never
-- compiles {caller} nor plans its catalog reads (a cron run's whole server time).
-- Every function a team calls pins search_path and names every object with its
-- schema.  A branch PL/pgSQL never runs is never planned: the fence column is named
-- only when a caller asks for fencing tokens.

-- Who is calling, and which role's grant lets it lock p_lock_key.  The caller is the
-- session's login role: inside a SECURITY DEFINER function current_user is the owner,
-- and a role reached with SET ROLE cannot be seen; a login role acts with the grants
-- of the roles it is a member of (GRANT billing TO billing_app).
--   * The owner (or a member of it), a superuser, a role that bypasses row-level
--     security: any key; role is the caller.
--   * A table without grants (row-level security off): a role that may read, insert
--     into and update the table, any key, as with the plain statements; others nothing.
--   * Otherwise the grants' scopes (rows dislock:failover:scope:<role>, which only
--     `dislockctl grant` writes): role is the first of the caller's roles whose scope
--     matches the key (its longest-TTL record counts for its keys only), and a new
--     key (p_key has no row) counts against the smallest quota of the caller's
--     roles, with the quota rows of the caller's roles locked FOR UPDATE (rows only
--     the owner can lock: no role can hold them to stall another's new key, as it
--     could an advisory lock), so that concurrent transactions cannot both pass the
--     last place.
--   * A group row (LOCK_GROUP) is no grant's: its name is every fleet's
--     (docs/security.md, "Groups").
-- p_lock_key NULL: no key to check; scope is then every key the caller may lock (a
-- regular expression; NULL: any key).
-- Called only by the lock and history functions, which run as their table's owner
-- with search_path pinned: it is neither SECURITY DEFINER nor pinned itself, since each
-- would save and restore settings again on every call of every lock step.
CREATE OR REPLACE FUNCTION {caller}(
    p_key text, p_lock_key text, OUT role text, OUT scope text
)
LANGUAGE plpgsql VOLATILE AS $caller$
DECLARE
    v_owner oid;
    v_secured boolean;
    v_roles text[];
    v_most int8;
    v_held int8;
BEGIN
    role := session_user::text;
    SELECT c.relowner, c.relrowsecurity INTO v_owner, v_secured
        FROM pg_catalog.pg_class AS c WHERE c.oid = {table_oid};
    -- Two tests, not one OR: PL/pgSQL plans a condition whole when a session first
    -- runs it, and an owner's session need never plan the pg_roles view.
    IF pg_catalog.pg_has_role(session_user, v_owner, 'MEMBER') THEN
        RETURN;
    END IF;
    IF EXISTS (SELECT FROM pg_catalog.pg_roles AS r
               WHERE r.rolname = session_user AND (r.rolsuper OR r.rolbypassrls))
    THEN
        RETURN;
    END IF;
    IF NOT v_secured THEN
        IF pg_catalog.has_table_privilege(session_user, {table_oid}, 'SELECT')
            AND pg_catalog.has_table_privilege(session_user, {table_oid}, 'INSERT')
            AND pg_catalog.has_table_privilege(session_user, {table_oid}, 'UPDATE')
        THEN
            RETURN;
        END IF;
        RAISE EXCEPTION USING ERRCODE = 'insufficient_privilege',
            MESSAGE = pg_catalog.format('permission denied for table %s', {shown});
    END IF;
    IF starts_with(p_key, {group_row}) THEN
        RAISE EXCEPTION USING ERRCODE = 'insufficient_privilege',
            MESSAGE = pg_catalog.format('role %L may not lock %L in %s: ' || {no_grant},
                session_user, p_key, {shown});
    END IF;
    -- The common case first, in two primary-key reads: the login role's own grant
    -- covers the key, and the key has its row (no quota to count).  (Names are of
    -- collation "C": compared as such, the key's index could not answer.)
    IF p_lock_key IS NOT NULL THEN
        SELECT s.value INTO scope FROM {table} AS s
            WHERE s.key = {scope_prefix} || session_user::text COLLATE "default";
        IF p_lock_key ~ scope
            AND (p_key IS NULL OR EXISTS (SELECT FROM {table} AS t WHERE t.key = p_key))
        THEN
            RETURN;
        END IF;
    END IF;
    WITH RECURSIVE member_of (oid) AS (
        SELECT r.oid FROM pg_catalog.pg_roles AS r WHERE r.rolname = session_user
        UNION
        SELECT m.roleid FROM pg_catalog.pg_auth_members AS m
        JOIN member_of ON m.member = member_of.oid
    )
    SELECT pg_catalog.array_agg(r.rolname::text COLLATE "default"
            ORDER BY r.rolname <> session_user, r.rolname)
        INTO v_roles FROM member_of JOIN pg_catalog.pg_roles AS r ON r.oid = member_of.oid;
    IF p_lock_key IS NULL THEN
        SELECT pg_catalog.string_agg('(?:' || s.value || ')', '|') INTO scope
            FROM pg_catalog.unnest(v_roles) AS granted (name)
            JOIN {table} AS s ON s.key = {scope_prefix} || granted.name;
        scope := coalesce(scope, '^(?!)');
        RETURN;
    END IF;
    SELECT granted.name, s.value INTO role, scope
        FROM pg_catalog.unnest(v_roles) WITH ORDINALITY AS granted (name, n)
        JOIN {table} AS s ON s.key = {scope_prefix} || granted.name
        WHERE p_lock_key ~ s.value ORDER BY granted.n LIMIT 1;
    IF NOT FOUND AND NOT EXISTS (
        SELECT FROM pg_catalog.unnest(v_roles) AS granted (name)
        JOIN {table} AS s ON s.key = {scope_prefix} || granted.name)
    THEN
        -- No grant at all (never granted, or revoked): as a missing privilege reads.
        RAISE EXCEPTION USING ERRCODE = 'insufficient_privilege',
            MESSAGE = pg_catalog.format('permission denied for table %s', {shown});
    ELSIF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'insufficient_privilege',
            MESSAGE = pg_catalog.format(
                'role %L may not lock %L in %s: ' || {no_grant}, session_user,
                p_lock_key, {shown});
    END IF;
    IF p_key IS NULL OR EXISTS (SELECT FROM {table} AS t WHERE t.key = p_key) THEN
        RETURN;
    END IF;
    SELECT min(q.value::int8) INTO v_most FROM pg_catalog.unnest(v_roles) AS granted (name)
        JOIN {table} AS q ON q.key = {quota_prefix} || granted.name;
    IF v_most IS NULL THEN
        RETURN;
    ELSIF pg_catalog.current_setting('transaction_isolation') <> 'read committed' THEN
        -- A snapshot older than this statement would count the keys that others have
        -- committed since as not there, whatever the lock below serialised.
        RAISE EXCEPTION USING ERRCODE = 'insufficient_privilege',
            MESSAGE = pg_catalog.format('role %L takes a new key of %s under its quota'
                || ' only in a READ COMMITTED transaction', role, {shown});
    END IF;
    PERFORM FROM {table} AS q
        WHERE q.key IN (SELECT {quota_prefix} || granted.name
                        FROM pg_catalog.unnest(v_roles) AS granted (name))
        ORDER BY q.key FOR UPDATE;
    -- A key that has a row already (its other strategy, another slot, its pause) is
    -- not one more key.  (A scan: only an acquisition of a new key gets here.)
    SELECT count(DISTINCT {lock_key_of_key}) INTO v_held FROM {table} AS t
        WHERE NOT starts_with(t.key, 'dislock:') AND {lock_key_of_key} ~ scope;
    IF v_held >= v_most AND NOT EXISTS (
        SELECT FROM {table} AS t WHERE {lock_key_of_key} = p_lock_key
        AND NOT starts_with(t.key, 'dislock:'))
    THEN
        RAISE EXCEPTION USING ERRCODE = 'insufficient_privilege',
            MESSAGE = pg_catalog.format(
                'role %L ' || {over} || ' %s %s in %s: key %L would be one more'
                || ' (its dislockctl grant again with --max-keys N raises the limit)',
                role, v_most, CASE WHEN v_most = 1 THEN 'key' ELSE 'keys' END, {shown},
                p_lock_key);
    END IF;
END
$caller$;

-- The lock key that every row key of p_keys belongs to (a schedule, lease or group
-- row, or one of their further slots, 2 to 1000), and whose pause row p_pause is
-- when given.  Anything else (a pause row, dislock's metadata rows, a slot past the
-- last) is refused, whatever the caller's grant: no team writes those through a lock
-- function.
CREATE OR REPLACE FUNCTION {lock_of}(p_keys text[], p_pause text, OUT lock_key text)
LANGUAGE plpgsql IMMUTABLE AS $lock_of$
DECLARE
    v_key text;
    v_found text;
BEGIN
    FOREACH v_key IN ARRAY p_keys LOOP
        v_found := (regexp_match(v_key, {row_key}))[1];
        IF v_found IS NULL OR v_found IS DISTINCT FROM coalesce(lock_key, v_found)
            OR octet_length(v_key) > {max_bytes}
        THEN
            RAISE EXCEPTION USING ERRCODE = 'insufficient_privilege',
                MESSAGE = format('%L is no lock row of dislock''s', left(v_key, 200));
        END IF;
        lock_key := v_found;
    END LOOP;
    IF lock_key IS NULL OR (p_pause IS NOT NULL AND p_pause <> {pause_prefix} || lock_key) THEN
        RAISE EXCEPTION USING ERRCODE = 'insufficient_privilege',
            MESSAGE = format('%L is not the pause row of the lock', left(p_pause, 200));
    END IF;
END
$lock_of$;

-- Take the row p_key until p_expire_at (a schedule slot's end) or for p_ttl seconds
-- (a lease, p_expire_at NULL): lock_queries' acquire_until and acquire_for.  One row:
-- dislock.core.answers.ClaimRow.  A fresh session compiles this function and plans
-- its statements once: so every row it decides by is read in one statement, and the
-- failover bookkeeping (dislock.core.failover) is written out here rather than in a
-- function of its own.
CREATE OR REPLACE FUNCTION {acquire}(
    p_key text, p_pause text, p_owner text, p_expire_at timestamptz, p_ttl float8,
    p_fencing boolean,
    OUT acquired boolean, OUT token int8, OUT paused_for text, OUT paused_until timestamptz,
    OUT timeline int8, OUT delayed_until timestamptz, OUT ttl_cap float8
)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $acquire$
#variable_conflict use_column
DECLARE
    v_lock_key text := (regexp_match(p_key, {row_key}))[1];
    v_ttl float8 := coalesce(p_ttl, 0);
    v_record text;
    v_seen int8;
    v_noticed timestamptz;
    v_cap float8;
    v_recorded float8;
    v_live boolean;
    v_longest float8;
    v_end timestamptz;
BEGIN
    acquired := false;
    IF v_lock_key IS NULL OR p_pause IS DISTINCT FROM {pause_prefix} || v_lock_key
        OR octet_length(p_key) > {max_bytes} OR octet_length(p_owner) > {max_bytes}
    THEN
        RAISE EXCEPTION USING ERRCODE = 'insufficient_privilege',
            MESSAGE = format('%L is no lock row of dislock''s (with its pause row, an owner'
                || ' token of at most ' || {max_bytes} || ' bytes)', left(p_key, 200));
    END IF;
    -- A lease for a finite TTL, a slot until a finite end: a call by hand stores no row
    -- that never ends (a NaN is above 'Infinity').
    IF NOT coalesce(CASE WHEN p_ttl IS NULL THEN isfinite(p_expire_at) AND p_expire_at < {never}
                    ELSE p_expire_at IS NULL AND p_ttl > 0 AND p_ttl < 'Infinity' END, false)
    THEN
        RAISE EXCEPTION USING ERRCODE = 'invalid_parameter_value',
            MESSAGE = 'a lock is taken for a TTL of more than 0 seconds or until a slot''s end'
                || ' before 9999-12-31 (p_ttl or p_expire_at, not both, not infinite)';
    END IF;
    IF pg_catalog.pg_has_role(session_user, current_user, 'MEMBER') THEN
        v_record := {ttl_prefix} || session_user::text;
    ELSE
        v_record := {ttl_prefix} || (SELECT c.role FROM {caller}(p_key, v_lock_key) AS c);
    END IF;
    timeline := {timeline};
    -- Every row the acquisition decides by, in one read by primary key: the failover
    -- timeline, the table's maximum TTL, the role's longest-TTL record, a live pause,
    -- a live row.  (Casts after the filter: a lock row's value is no number.  A pause
    -- written 'infinity' by hand is one until resumed: psycopg loads no infinity.)
    SELECT max(t.value) FILTER (WHERE t.key = {timeline_key})::int8,
           max(t.expire_at) FILTER (WHERE t.key = {timeline_key}),
           coalesce(max(t.value) FILTER (WHERE t.key = {max_ttl_key})::float8, {default_max_ttl}),
           max(t.value) FILTER (WHERE t.key = v_record)::float8,
           max(t.value) FILTER (WHERE t.key = p_pause AND t.expire_at > now()),
           max(least(t.expire_at, {never})) FILTER (WHERE t.key = p_pause AND t.expire_at > now()),
           coalesce(bool_or(t.key = p_key AND t.expire_at > now()), false)
        INTO v_seen, v_noticed, v_cap, v_recorded, paused_for, paused_until, v_live
        FROM {table} AS t
        WHERE t.key IN ({timeline_key}, {max_ttl_key}, v_record, p_pause, p_key);
    IF v_seen IS DISTINCT FROM timeline THEN
        -- A different timeline is recorded with the instant it was noticed, where
        -- every key's delay starts; the first one ever recorded starts none.
        INSERT INTO {table} AS noted (key, value, expire_at)
        VALUES ({timeline_key}, timeline::text,
                CASE WHEN v_seen IS NULL THEN {never_noticed} ELSE now() END)
        ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value, expire_at = EXCLUDED.expire_at
        WHERE noted.value IS DISTINCT FROM EXCLUDED.value;
    END IF;
    IF v_ttl > 0 AND v_ttl <= v_cap AND coalesce(v_recorded, 0) < v_ttl THEN
        -- Two acquisitions of one role at once: the shorter TTL must not win.
        INSERT INTO {table} AS noted (key, value, expire_at)
        VALUES (v_record, v_ttl::text, {never})
        ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value
        WHERE noted.value::float8 < EXCLUDED.value::float8;
    END IF;
    -- Within the table's maximum TTL of a failover, the key waits for the longest TTL
    -- of the roles that may hold it (a scan of their records, only then).  A running
    -- delay is judged by the real time: now() is this transaction's start.
    IF v_seen IS NOT NULL AND NOT (v_seen = timeline
        AND clock_timestamp() >= v_noticed + make_interval(secs => v_cap))
    THEN
        v_longest := least(v_cap, greatest(v_ttl, coalesce(
            (SELECT max(r.value::float8) FROM {table} AS r
             WHERE starts_with(r.key, {ttl_prefix})
             AND coalesce(v_lock_key ~ (SELECT scope.value FROM {table} AS scope
                 WHERE scope.key = {scope_prefix} || substr(r.key, {after_ttl_prefix})), true)),
            0)));
        IF v_longest > (CASE WHEN v_seen <> timeline THEN 0
                        ELSE extract(epoch FROM clock_timestamp() - v_noticed) END)
        THEN
            delayed_until := (CASE WHEN v_seen <> timeline THEN now() ELSE v_noticed END)
                + make_interval(secs => v_longest);
        END IF;
    END IF;
    IF p_ttl IS NOT NULL AND p_ttl > v_cap THEN
        ttl_cap := v_cap;
        RETURN;
    END IF;
    v_end := coalesce(p_expire_at, now() + make_interval(secs => p_ttl));
    -- A visibly live row refuses before the upsert would lock it (and so write WAL).
    -- A slot that ended between computing it and claiming it is not claimed.
    IF v_live OR paused_until IS NOT NULL OR delayed_until IS NOT NULL OR v_end <= now() THEN
        RETURN;
    END IF;
    IF p_fencing THEN
        -- A fresh row starts at 1; a taken-over row continues from its last token.
        INSERT INTO {table} AS held (key, value, expire_at, fence)
        VALUES (p_key, p_owner, v_end, 1)
        ON CONFLICT (key) DO UPDATE
        SET value = EXCLUDED.value, expire_at = EXCLUDED.expire_at, fence = held.fence + 1
        WHERE held.expire_at <= now()
        RETURNING held.fence INTO token;
    ELSE
        INSERT INTO {table} AS held (key, value, expire_at)
        VALUES (p_key, p_owner, v_end)
        ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value, expire_at = EXCLUDED.expire_at
        WHERE held.expire_at <= now();
    END IF;
    acquired := FOUND;
END
$acquire$;

-- acquire_until for the schedule slot that now() picks among candidates: the slot
-- ending p_ends[i] for the first i with now() <= p_latest[i].  One row:
-- dislock.core.answers.ClockClaimRow (slot_end NULL: now() is outside the candidates,
-- nothing was taken).
CREATE OR REPLACE FUNCTION {acquire_by_clock}(
    p_key text, p_pause text, p_owner text, p_covered_from timestamptz,
    p_ends timestamptz[], p_latest timestamptz[], p_fencing boolean,
    OUT acquired boolean, OUT token int8, OUT paused_for text, OUT paused_until timestamptz,
    OUT timeline int8, OUT delayed_until timestamptz, OUT slot_end timestamptz
)
LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp AS $by_clock$
#variable_conflict use_column
BEGIN
    IF now() >= p_covered_from THEN
        FOR i IN 1 .. coalesce(array_length(p_latest, 1), 0) LOOP
            IF now() <= p_latest[i] THEN
                slot_end := p_ends[i];
                EXIT;
            END IF;
        END LOOP;
    END IF;
    IF slot_end IS NULL THEN
        -- Nothing to take; the bookkeeping and the pause are answered all the same.
        SELECT false, NULL, a.paused_for, a.paused_until, a.timeline, a.delayed_until
            INTO acquired, token, paused_for, paused_until, timeline, delayed_until
            FROM {acquire}(p_key, p_pause, p_owner, now(), NULL, p_fencing) AS a;
        RETURN;
    END IF;
    SELECT a.acquired, a.token, a.paused_for, a.paused_until, a.timeline, a.delayed_until
        INTO acquired, token, paused_for, paused_until, timeline, delayed_until
        FROM {acquire}(p_key, p_pause, p_owner, slot_end, NULL, p_fencing) AS a;
END
$by_clock$;

-- Renew each listed lease that is still ours (parallel arrays), each by its own TTL;
-- a row (key, owner) per lease renewed.  A lease longer than the table's maximum
-- (lowered while it ran) is not renewed, so it alone is lost.
CREATE OR REPLACE FUNCTION {renew}(p_keys text[], p_owners text[], p_ttls float8[])
RETURNS TABLE (key text, owner text)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $renew$
#variable_conflict use_column
DECLARE
    v_scope text;
BEGIN
    IF NOT pg_catalog.pg_has_role(session_user, current_user, 'MEMBER') THEN
        v_scope := (SELECT c.scope FROM {caller}(NULL, NULL) AS c);
    END IF;
    RETURN QUERY
    UPDATE {table} AS held SET expire_at = now() + make_interval(secs => batch.ttl)
    FROM unnest(p_keys, p_owners, p_ttls) AS batch (key, value, ttl)
    WHERE held.key = batch.key AND held.value = batch.value AND held.expire_at > now()
    AND batch.ttl <= {cap}
    AND (regexp_match(held.key, {row_key}))[1] ~ coalesce(v_scope, '')
    RETURNING held.key, held.value;
END
$renew$;

-- Expire our row p_key now, marked released, and wake the lease's waiters (NOTIFY
-- on commit); a row (true) if it ended one, none if another owner had taken it.
CREATE OR REPLACE FUNCTION {release}(
    p_key text, p_owner text, p_channel text, p_wake_key text
) RETURNS SETOF boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $release$
#variable_conflict use_column
BEGIN
    IF NOT pg_catalog.pg_has_role(session_user, current_user, 'MEMBER') THEN
        PERFORM FROM {caller}(NULL, (regexp_match(p_key, {row_key}))[1]);
    END IF;
    RETURN QUERY
    UPDATE {table} SET expire_at = now(), value = value || {released}
    WHERE key = p_key AND value = p_owner AND expire_at > now()
    RETURNING pg_notify(p_channel, {wake}) IS NOT NULL;
END
$release$;

COMMENT ON FUNCTION {acquire}(text, text, text, timestamptz, float8, boolean) IS {version};

-- Called only from the functions above (which run as the owner).
REVOKE ALL ON FUNCTION {caller}(text, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION {lock_of}(text[], text) FROM PUBLIC;
