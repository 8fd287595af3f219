-- The run history's writes, as functions beside the history table
-- (dislock.core.history_functions): `dislockctl init --history` and `grant` install
-- them, and a wrapper records a run's start and end through them, so that a team of
-- `dislockctl grant` needs no right to write the history table.  They run as the
-- owner, check the caller with the lock table's {caller} (a run is recorded for a
-- key the caller may lock), bound what they write, take the start and end times
-- from the server's clock, and keep each role within its history budget.

-- A role's history budget: its runs' rows, tails included, and its rows of the audit
-- trail (which the trail's writer counts, and is never refused for), counted in a metadata
-- row of the lock table ({used_prefix}<role>, bytes) as they are written, and never
-- recounted (a count from the rows would read the whole history at every write past
-- it).  p_bytes are counted if they fit, or p_always (a row written all the same, or
-- a negative count of rows pruned).  True: within the budget.
CREATE OR REPLACE FUNCTION {within_budget}(p_role text, p_bytes int8, p_always boolean)
RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $budget$
DECLARE
    v_most int8;
    v_used int8;
BEGIN
    SELECT b.value::int8 INTO v_most FROM {table} AS b WHERE b.key = {budget_prefix} || p_role;
    IF v_most IS NULL THEN
        RETURN true;
    END IF;
    INSERT INTO {table} AS used (key, value, expire_at)
    VALUES ({used_prefix} || p_role,
        (CASE WHEN p_always OR p_bytes <= v_most THEN p_bytes ELSE 0 END)::text, {never})
    ON CONFLICT (key) DO UPDATE SET value = (used.value::int8 + EXCLUDED.value::int8)::text
    WHERE p_always OR used.value::int8 + p_bytes <= v_most
    RETURNING used.value::int8 INTO v_used;
    RETURN coalesce(v_used <= v_most AND (p_always OR p_bytes <= v_most), false);
END
$budget$;

-- Of an older version, which took no p_always and counted the rows again past the budget.
DROP FUNCTION IF EXISTS {within_budget}(text, int8);

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
    v_pruned boolean;
BEGIN
    IF greatest(octet_length(p_lock_key), octet_length(p_modes), octet_length(p_owner),
        octet_length(p_host), octet_length(p_cron), octet_length(p_cron_tz)) > {max_bytes}
    THEN
        RAISE EXCEPTION USING ERRCODE = 'insufficient_privilege',
            MESSAGE = 'a text is longer than ' || {max_bytes} || ' bytes';
    END IF;
    SELECT c.role INTO v_role FROM {caller}(NULL, p_lock_key) AS c;
    IF NOT {within_budget}(v_role, 64 + octet_length(p_lock_key) + octet_length(p_modes)
        + octet_length(p_owner) + octet_length(p_host) + coalesce(octet_length(p_cron), 0)
        + coalesce(octet_length(p_cron_tz), 0), true)
    THEN
        -- Past the budget, the run is recorded all the same, and its key's two oldest
        -- ended runs make room (read by the key's index, not the whole history; never
        -- its newest success, which a LOCK_AFTER dependant reads): a role's rows stay
        -- within its budget and a row of each of its keys.
        WITH pruned AS (
            DELETE FROM {history} AS h WHERE h.id IN (
                SELECT o.id FROM {history} AS o WHERE o.lock_key = p_lock_key
                AND o.ended_at IS NOT NULL
                AND o.started_at IS DISTINCT FROM (SELECT s.started_at FROM ({last_success}) AS s)
                ORDER BY o.started_at LIMIT 2)
            RETURNING {row_bytes} AS bytes)
        SELECT {within_budget}(v_role, -coalesce(sum(pruned.bytes), 0), true) INTO v_pruned
            FROM pruned;
    END IF;
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
    v_key text;
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
    -- The run's key (a run's key never changes): no open run, nothing to end.  The
    -- caller is checked on that key, and the one UPDATE writes that key's row alone, so
    -- no row inserted or ended meanwhile is ended by a role that may not lock its key.
    SELECT h.lock_key INTO v_key FROM {history} AS h WHERE h.id = p_id AND h.ended_at IS NULL;
    IF v_key IS NULL THEN
        RETURN;
    END IF;
    SELECT c.role INTO v_role FROM {caller}(NULL, v_key) AS c;
    IF v_tails > 0 AND NOT {within_budget}(v_role, v_tails, false) THEN
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
        WHERE id = p_id AND lock_key = v_key AND ended_at IS NULL
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
REVOKE ALL ON FUNCTION {within_budget}(text, int8, boolean) FROM PUBLIC;
