-- The run history's writes, as functions beside the history table
-- (dislock.core.history_functions): `dislockctl init --history` and `grant` install
-- them, and a wrapper records a run's start and end through them, so that a team of
-- `dislockctl grant` needs no right to write the history table.  They run as the
-- owner, check the caller with the lock table's {caller} (a run is recorded for a
-- key the caller may lock), bound what they write, take the start and end times
-- from the server's clock, and keep each role within its history budget.

-- A role's history budget: its runs' rows, tails included, and its rows of the audit
-- trail (which the trail's writer counts, and is never refused for), counted in a metadata
-- row of the lock table ({used_prefix}<role>, bytes) as they are written.  A prune
-- frees room the count does not see: past the budget the rows are counted again,
-- and only a count that is still over drops the run's tails.  True: within budget.
CREATE OR REPLACE FUNCTION {within_budget}(p_role text, p_bytes int8)
RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $budget$
DECLARE
    v_most int8;
    v_used int8;
    v_scope text;
BEGIN
    SELECT b.value::int8 INTO v_most FROM {table} AS b WHERE b.key = {budget_prefix} || p_role;
    IF v_most IS NULL THEN
        RETURN true;
    END IF;
    INSERT INTO {table} AS used (key, value, expire_at)
    VALUES ({used_prefix} || p_role, p_bytes::text, {never})
    ON CONFLICT (key) DO UPDATE SET value = (used.value::int8 + EXCLUDED.value::int8)::text
    RETURNING used.value::int8 INTO v_used;
    IF v_used <= v_most THEN
        RETURN true;
    END IF;
    SELECT s.value INTO v_scope FROM {table} AS s WHERE s.key = {scope_prefix} || p_role;
    SELECT coalesce(sum(pg_column_size(h.*)), 0) + p_bytes INTO v_used
        FROM {history} AS h WHERE h.lock_key ~ coalesce(v_scope, '^(?!)');
    -- The role's rows of the audit trail count too (dislock.core.audit_trail), where
    -- the table has one (named, not planned, since an older table has none).
    IF pg_catalog.to_regclass({trail}) IS NOT NULL THEN
        EXECUTE 'SELECT $2 + coalesce(sum(pg_catalog.pg_column_size(a.*)), 0) FROM '
            || {trail} || ' AS a WHERE a.lock_key ~ $1'
            INTO v_used USING coalesce(v_scope, '^(?!)'), v_used;
    END IF;
    UPDATE {table} SET value = v_used::text WHERE key = {used_prefix} || p_role;
    RETURN v_used <= v_most;
END
$budget$;

-- A run starts: its row, on the server's clock; its id, and the key's last successful
-- run before it (dislock.core.history.last_success_query).  Its answer grew those
-- columns: a function of an older version is dropped first (a caller of this
-- version reads the id alone from an older one).
DO $drop$ BEGIN
    IF obj_description(to_regprocedure({start_signature}), 'pg_proc') IS DISTINCT FROM {version}
    THEN
        EXECUTE 'DROP FUNCTION IF EXISTS ' || {start_signature};
    END IF;
END
$drop$;

CREATE OR REPLACE FUNCTION {start}(
    p_lock_key text, p_modes text, p_slot_end timestamptz, p_owner text, p_host text,
    p_pid int4, p_cron text, p_cron_tz text
) RETURNS TABLE (id int8, last_started_at timestamptz, last_slot_end timestamptz,
    last_cron text, last_cron_tz text)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $start$
#variable_conflict use_column
DECLARE
    v_role text;
BEGIN
    IF greatest(octet_length(p_lock_key), octet_length(p_modes), octet_length(p_owner),
        octet_length(p_host), octet_length(p_cron), octet_length(p_cron_tz)) > {max_bytes}
    THEN
        RAISE EXCEPTION USING ERRCODE = 'insufficient_privilege',
            MESSAGE = 'a text is longer than ' || {max_bytes} || ' bytes';
    END IF;
    SELECT c.role INTO v_role FROM {caller}(NULL, p_lock_key) AS c;
    PERFORM {within_budget}(v_role, 64 + octet_length(p_lock_key) + octet_length(p_modes)
        + octet_length(p_owner) + octet_length(p_host) + coalesce(octet_length(p_cron), 0)
        + coalesce(octet_length(p_cron_tz), 0));
    PERFORM set_config('synchronous_commit', 'off', true);
    RETURN QUERY
    WITH succeeded AS ({last_success}), run AS (
        INSERT INTO {history} (lock_key, modes, slot_end, owner, host, pid, started_at, cron,
            cron_tz)
        VALUES (p_lock_key, p_modes, p_slot_end, p_owner, p_host, p_pid, now(), p_cron, p_cron_tz)
        RETURNING {history}.id)
    SELECT run.id, succeeded.* FROM run LEFT JOIN succeeded ON true;
END
$start$;

-- A run ends, once: how, on the server's clock (p_ended_at: the time a run kept on
-- its host really ended), with its output's tails unless the role is past its
-- budget.  A success wakes the jobs that wait for it (dislock.core.after).
CREATE OR REPLACE FUNCTION {end}(
    p_id int8, p_outcome text, p_exit_code int4, p_signal int4, p_ended_at timestamptz,
    p_stdout_tail text, p_stderr_tail text
) RETURNS SETOF boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $end$
#variable_conflict use_column
DECLARE
    v_role text;
    v_tails int8 := coalesce(octet_length(p_stdout_tail), 0)
        + coalesce(octet_length(p_stderr_tail), 0);
    v_row record;
BEGIN
    IF p_outcome IS NULL OR p_outcome NOT IN ({outcomes})
        OR greatest(octet_length(p_stdout_tail), octet_length(p_stderr_tail)) > {max_tail}
    THEN
        RAISE EXCEPTION USING ERRCODE = 'insufficient_privilege',
            MESSAGE = 'not an end dislock records';
    END IF;
    SELECT c.role INTO v_role FROM {caller}(NULL,
        (SELECT h.lock_key FROM {history} AS h WHERE h.id = p_id AND h.ended_at IS NULL)) AS c;
    IF v_tails > 0 AND NOT {within_budget}(v_role, v_tails) THEN
        p_stdout_tail := NULL;
        p_stderr_tail := NULL;
    END IF;
    PERFORM set_config('synchronous_commit', 'off', true);
    FOR v_row IN
        -- An end kept on its host carries when the run ended: between its start and now.
        UPDATE {history} SET ended_at = least(greatest(coalesce(p_ended_at, now()), started_at),
            now()), outcome = p_outcome,
            exit_code = p_exit_code, signal = p_signal,
            stdout_tail = p_stdout_tail, stderr_tail = p_stderr_tail
        WHERE id = p_id AND ended_at IS NULL
        RETURNING {notice}
    LOOP
        RETURN NEXT true;
    END LOOP;
END
$end$;

-- A slot held back for the keys it comes after (dislock.core.after): its event's
-- row, unless the slot has one; its id, none if it had.
CREATE OR REPLACE FUNCTION {held_back}(
    p_lock_key text, p_slot_start timestamptz, p_slot_end timestamptz, p_owner text,
    p_host text, p_pid int4, p_cron text, p_cron_tz text, p_outcome text
) RETURNS TABLE (id int8)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $held$
#variable_conflict use_column
BEGIN
    IF p_outcome NOT IN ({held_outcomes}) OR greatest(octet_length(p_lock_key),
        octet_length(p_owner), octet_length(p_host), octet_length(p_cron),
        octet_length(p_cron_tz)) > {max_bytes}
    THEN
        RAISE EXCEPTION USING ERRCODE = 'insufficient_privilege',
            MESSAGE = 'not an event dislock records';
    END IF;
    PERFORM FROM {caller}(NULL, p_lock_key);
    PERFORM set_config('synchronous_commit', 'off', true);
    RETURN QUERY
    INSERT INTO {history} AS h (lock_key, modes, slot_end, owner, host, pid, started_at, ended_at,
        outcome, cron, cron_tz)
    SELECT p_lock_key, {held_modes}, p_slot_end, p_owner, p_host, p_pid, now(), now(), p_outcome,
        p_cron, p_cron_tz
    WHERE NOT EXISTS (SELECT FROM {history} AS e WHERE e.lock_key = p_lock_key
        AND e.started_at >= p_slot_start AND e.modes = {held_modes} AND e.slot_end = p_slot_end)
    RETURNING h.id;
END
$held$;

COMMENT ON FUNCTION {start}(text, text, timestamptz, text, text, int4, text, text) IS {version};
REVOKE ALL ON FUNCTION {within_budget}(text, int8) FROM PUBLIC;
