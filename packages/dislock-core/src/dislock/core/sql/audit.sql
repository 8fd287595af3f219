-- The audit trail of one lock table (dislock.core.audit_trail): `dislockctl init`
-- creates it.  No granted role may write it: row-level security is on and no policy
-- lets a role insert, change or delete a row; its rows are written only by {audit},
-- which runs as the table's owner, in the transaction of the action it records.
CREATE TABLE IF NOT EXISTS {trail} (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at timestamptz NOT NULL, login_role text NOT NULL, acted_as text NOT NULL,
    action text NOT NULL, lock_key text, detail text, reason text);
CREATE INDEX IF NOT EXISTS {key_index} ON {trail} (lock_key, at);
ALTER TABLE {trail} ENABLE ROW LEVEL SECURITY;
REVOKE ALL ON {trail} FROM PUBLIC;

-- Record an action: when and who from the server (the login role, and the role it
-- acted as: the caller's current_user, which p_acted_as defaults to, evaluated where
-- the call is, and which must be a role the login role may be), what and why from
-- the caller.  A table-wide action (a NULL key) only by the table's owner; a pause,
-- resume, release or retire, on a table with grants, only by a role whose grant covers
-- the key and lets it delete rows (an operator), a rerun by one that may also update
-- them (a wrapper's `--plain-writes` grant); without grants, by a role that may update
-- or delete the table's rows (as the commands need); a fence or
-- unfence by any role (`fence` checks whose table and which key), named as itself.
-- Counted in the role's history budget, and never refused for it.
CREATE OR REPLACE FUNCTION {audit}(
    p_action text, p_lock_key text, p_detail text, p_reason text,
    p_acted_as text DEFAULT current_user
) RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $audit$
DECLARE
    v_owner oid;
    v_secured boolean;
    v_role text := session_user::text;
    v_bytes int8;
BEGIN
    IF p_action IS NULL OR p_action NOT IN ({actions})
        OR greatest(octet_length(p_lock_key), octet_length(p_detail)) > {max_bytes}
        OR octet_length(p_reason) > {max_reason} OR p_acted_as IS NULL
        OR NOT pg_catalog.pg_has_role(session_user, p_acted_as, 'MEMBER')
        OR (p_lock_key IS NULL) <> (p_action IN ({table_wide}))
    THEN
        RAISE EXCEPTION USING ERRCODE = 'insufficient_privilege',
            MESSAGE = 'not an action dislock audits';
    END IF;
    SELECT c.relowner, c.relrowsecurity INTO v_owner, v_secured
        FROM pg_catalog.pg_class AS c WHERE c.oid = {table_oid};
    IF p_lock_key IS NULL THEN
        IF NOT pg_catalog.pg_has_role(session_user, v_owner, 'MEMBER') THEN
            RAISE EXCEPTION USING ERRCODE = 'insufficient_privilege',
                MESSAGE = pg_catalog.format('only the owner of %s audits %s', {shown}, p_action);
        END IF;
    ELSIF p_action IN ({operators}) THEN
        IF v_secured THEN
            v_role := (SELECT c.role FROM {caller}(NULL, p_lock_key) AS c);
        END IF;
        IF NOT (pg_catalog.has_table_privilege(session_user, {table_oid}, 'DELETE')
            OR ((NOT v_secured OR p_action = 'rerun')
                AND pg_catalog.has_any_column_privilege(session_user, {table_oid}, 'UPDATE')))
        THEN
            RAISE EXCEPTION USING ERRCODE = 'insufficient_privilege',
                MESSAGE = pg_catalog.format('permission denied for table %s', {shown});
        END IF;
    END IF;
    v_bytes := 64 + coalesce(octet_length(p_lock_key), 0) + coalesce(octet_length(p_detail), 0)
        + coalesce(octet_length(p_reason), 0) + octet_length(session_user::text)
        + octet_length(p_acted_as) + octet_length(p_action);
    IF EXISTS (SELECT FROM {table} AS b WHERE b.key = {budget_prefix} || v_role) THEN
        INSERT INTO {table} AS used (key, value, expire_at)
        VALUES ({used_prefix} || v_role, v_bytes::text, {never})
        ON CONFLICT (key) DO UPDATE SET value = (used.value::int8 + EXCLUDED.value::int8)::text;
    END IF;
    INSERT INTO {trail} (at, login_role, acted_as, action, lock_key, detail, reason)
    VALUES (clock_timestamp(), session_user, p_acted_as, p_action, p_lock_key, p_detail,
        nullif(p_reason, ''));
END
$audit$;

COMMENT ON FUNCTION {audit}(text, text, text, text, text) IS {version};
-- Every role's commands call it (PUBLIC has EXECUTE by default, unless a hardened
-- server revoked it); it checks who may record what itself.
GRANT EXECUTE ON FUNCTION {audit}(text, text, text, text, text) TO PUBLIC;
