/*
 * Citus (0.2.1): lease.distribute() shards an installed pg_lease across a
 * Citus cluster, and lease._is_distributed() tells purge, whose
 * single-node statement Citus cannot run, which shape to take.  On a plain
 * server nothing here runs on any hot path.  extension/README.md, "Running
 * on Citus", says what holds there and what does not.
 */

/*
 * lease._is_distributed(): lease.leases is a Citus table in this database.
 * Without Citus (no pg_dist_partition) it costs one to_regclass.
 */
CREATE OR REPLACE FUNCTION lease._is_distributed()
    RETURNS boolean
    LANGUAGE plpgsql
    STABLE
    SET search_path = pg_catalog, pg_temp
AS $function$
DECLARE
    v_distributed boolean;
BEGIN
    IF pg_catalog.to_regclass('pg_catalog.pg_dist_partition') IS NULL THEN
        RETURN false;
    END IF;
    EXECUTE 'SELECT EXISTS (SELECT FROM pg_catalog.pg_dist_partition AS p
                             WHERE p.logicalrelid = ''lease.leases''::pg_catalog.regclass)'
       INTO v_distributed;
    RETURN v_distributed;
END;
$function$;

REVOKE ALL ON FUNCTION lease._is_distributed() FROM PUBLIC;

/*
 * lease.distribute(): on a Citus coordinator, makes pg_lease's state and
 * keyed calls distributed.  Idempotent: each step is skipped when done.
 *
 *   1. lease.leases.key becomes plain text COLLATE "C" with a CHECK of its
 *      length (what the domain lease.key_text checked): Citus prunes shards
 *      and delegates calls only on a distribution column of a base type.
 *      On one node the domain stays, being cheaper (install.sql).
 *   2. lease.leases is distributed by key.  Its durable-commit trigger goes
 *      with it to every shard (citus.enable_unsafe_triggers for this one
 *      statement): a commit that writes a key's row raises
 *      synchronous_commit on the node of its shard.
 *   3. lease.epoch_floor becomes a reference table (a copy on every node,
 *      written by purge on all of them in one distributed transaction), so
 *      a first grant on any node reads the floor.
 *   4. No function is distributed: every call runs on the coordinator (the
 *      node the client connects to), and Citus routes each of its
 *      statements to the shard of its key, or to every shard for list and
 *      purge.  Delegating a keyed call to its key's worker
 *      (create_distributed_function) was tried and dropped: inside a call
 *      Citus runs on a worker it cannot prune a statement that compares
 *      the key as l.key = p_key COLLATE "C" (nor FOR UPDATE it then), so
 *      every statement of the call went to every shard, a worker down made
 *      calls on the other workers' keys fail, and with the key in a "C"
 *      variable instead the statements found no row at all (Citus 13.2.2).
 *      So the coordinator's clock times every key.
 *
 * Who may call it: the extension's owner (the role that ran CREATE
 * EXTENSION, usually the database owner, not a superuser; for a bundle,
 * the installing role) and members of its role, and superusers.  The tables belong to the bootstrap superuser,
 * as every object of this trusted extension does, so it is SECURITY
 * DEFINER: it takes no argument, and what it does is fixed.
 *
 * Errors: 42501 for any other caller; 0A000 when Citus is not installed in
 * this database, or when this is not the coordinator; 55000 when the
 * cluster has no node that may hold shards.
 */
CREATE OR REPLACE FUNCTION lease.distribute()
    RETURNS void
    LANGUAGE plpgsql
    VOLATILE
    SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
    -- Citus's notices about copying the floor's row are not the caller's concern.
    SET client_min_messages = warning
AS $function$
DECLARE
    v_caller   CONSTANT text := lease._calling_role();
    -- A bundle install has no extension: its installing role owns this function.
    v_owner    oid := coalesce((SELECT e.extowner FROM pg_catalog.pg_extension AS e WHERE e.extname = 'pg_lease'),
                               current_user::pg_catalog.regrole::oid);
    v_nodes    boolean;
    v_retype   text;
    v_failed   text;
BEGIN
    IF NOT coalesce((SELECT r.rolsuper FROM pg_catalog.pg_roles AS r WHERE r.rolname = v_caller), false)
       AND NOT pg_catalog.pg_has_role(v_caller, v_owner, 'USAGE') THEN
        RAISE EXCEPTION 'pg_lease: only the owner of pg_lease may distribute it'
            USING ERRCODE = 'insufficient_privilege',
                  DETAIL = pg_catalog.format('%s is neither a superuser nor a member of %s, the extension''s owner.',
                                             v_caller, v_owner::pg_catalog.regrole::text);
    END IF;
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_extension AS e WHERE e.extname = 'citus') THEN
        RAISE EXCEPTION 'pg_lease: lease.distribute() needs Citus, which is not installed in this database'
            USING ERRCODE = 'feature_not_supported',
                  HINT = 'Start every node with shared_preload_libraries = ''citus'', CREATE EXTENSION citus in this database on each, add the workers with citus_add_node, then call lease.distribute() on the coordinator.';
    END IF;
    IF NOT pg_catalog.citus_is_coordinator() THEN
        RAISE EXCEPTION 'pg_lease: lease.distribute() must run on the Citus coordinator'
            USING ERRCODE = 'feature_not_supported',
                  HINT = 'Connect to the coordinator (citus_set_coordinator_host names it) and call it there.';
    END IF;
    EXECUTE 'SELECT EXISTS (SELECT FROM pg_catalog.pg_dist_node AS n
                             WHERE n.shouldhaveshards AND n.isactive AND n.noderole = ''primary'')'
       INTO STRICT v_nodes;
    IF NOT v_nodes THEN
        RAISE EXCEPTION 'pg_lease: the Citus cluster has no active node that holds shards'
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  HINT = 'Add workers with citus_add_node first.';
    END IF;

    -- 1. The distribution column: text, its length checked by the table.
    -- On the coordinator, and on every worker: Citus installed pg_lease
    -- there too, and a worker's own lease.leases is the table Citus checks
    -- a colocated table against (a business table distributed with
    -- colocate_with => 'lease.leases' was refused while the workers still
    -- had the domain).
    v_retype := $retype$
        DO $do$
        BEGIN
            IF (SELECT a.atttypid FROM pg_catalog.pg_attribute AS a
                 WHERE a.attrelid = 'lease.leases'::pg_catalog.regclass AND a.attname = 'key')
               <> 'pg_catalog.text'::pg_catalog.regtype THEN
                ALTER TABLE lease.leases
                    ALTER COLUMN key TYPE text COLLATE pg_catalog."C",
                    ADD CONSTRAINT leases_key_length
                        CHECK (pg_catalog.octet_length(key) BETWEEN 1 AND 1000);
            END IF;
        END
        $do$
    $retype$;
    EXECUTE v_retype;
    EXECUTE 'SELECT pg_catalog.string_agg(r.nodename || '':'' || r.nodeport || '': '' || r.result, ''; '')
               FROM pg_catalog.run_command_on_workers($1) AS r
              WHERE NOT r.success'
       INTO v_failed
      USING v_retype;
    IF v_failed IS NOT NULL THEN
        RAISE EXCEPTION 'pg_lease: lease.distribute() could not retype lease.leases.key on every worker'
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  DETAIL = v_failed,
                  HINT = 'Every worker needs pg_lease installed as on the coordinator (Citus installs it when the extension is created with the workers added).';
    END IF;

    -- 2, 3. The tables.
    IF NOT lease._is_distributed() THEN
        PERFORM pg_catalog.set_config('citus.enable_unsafe_triggers', 'on', true);
        PERFORM pg_catalog.create_distributed_table('lease.leases', 'key');
        PERFORM pg_catalog.set_config('citus.enable_unsafe_triggers', 'off', true);
    END IF;
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_dist_partition AS p
                    WHERE p.logicalrelid = 'lease.epoch_floor'::pg_catalog.regclass) THEN
        PERFORM pg_catalog.create_reference_table('lease.epoch_floor');
        -- The coordinator's local rows were copied into the reference table.
        PERFORM pg_catalog.truncate_local_data_after_distributing_table('lease.epoch_floor');
    END IF;

END;
$function$;

COMMENT ON FUNCTION lease.distribute() IS
    'distribute(): on a Citus coordinator, distribute pg_lease: lease.leases by key, the epoch floor as a reference table, '
    'the keyed calls colocated by key; idempotent; 0A000 without Citus';
