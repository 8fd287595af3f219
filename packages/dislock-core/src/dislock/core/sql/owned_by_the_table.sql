-- Functions given to the owner of the table they are beside
-- (dislock.core.protocol.owned_by_the_table): functions that run as their owner run
-- as the table's, since `init` may be run by a superuser or a member of the owner's
-- role, whose rights they must not carry.
DO $owner$
DECLARE
    v_owner text := (SELECT c.relowner::regrole::text
        FROM pg_catalog.pg_class AS c WHERE c.oid = {table_oid});
    v_function regprocedure;
BEGIN
    FOREACH v_function IN ARRAY ARRAY[{signatures}]::regprocedure[] LOOP
        IF (SELECT p.proowner::regrole::text FROM pg_catalog.pg_proc AS p
            WHERE p.oid = v_function) IS DISTINCT FROM v_owner
        THEN
            EXECUTE pg_catalog.format('ALTER FUNCTION %s OWNER TO %s', v_function, v_owner);
        END IF;
    END LOOP;
END
$owner$
