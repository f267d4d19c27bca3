/*
 * The guard: the first statements of every install and update script.
 *
 * These scripts run as the bootstrap superuser (the extension is trusted, so
 * any role with CREATE on the database may run them), while schema lease
 * may have been made, or been writable, by a less privileged role.  PostgreSQL's
 * "Security Considerations for Extension Scripts" ask for every statement to
 * be immune to objects such a role can plant.  How each part is:
 *
 *   1. search_path.  CREATE EXTENSION and ALTER EXTENSION UPDATE set it to
 *      "lease, pg_temp"; an operator planted in lease with an exact match,
 *      such as =(oid, regnamespace), would then beat pg_catalog's and run as
 *      superuser.  The script pins it to "pg_catalog, pg_temp" before it
 *      names anything.  Functions and operators are never looked up in
 *      pg_temp, and pg_catalog comes before it for types, so from here on an
 *      unqualified operator, function or type can only be pg_catalog's.
 *      The setting is LOCAL: PostgreSQL restores the caller's search_path
 *      when the script ends.  Every object of the extension is named with
 *      its schema; SQL-standard function bodies are bound while this path
 *      is in force.
 *   2. Nobody creating unseen.  The contents check (3) sees committed
 *      objects and this transaction's own, not those of transactions still
 *      open, and nothing keeps a session that may create in the schema from
 *      adding more until this transaction commits: creating a function,
 *      type or operator takes no lock on its schema.  Other sessions act on
 *      the schema as committed.  So schema lease is accepted only
 *        a. when this transaction made it (as CREATE EXTENSION does when it
 *           is missing): nobody else can see it.  The row's xmin being ours
 *           is no proof: a GRANT, REVOKE, RENAME or OWNER TO rewriting the
 *           row gives it that xmin too, and an administrator may well hand
 *           a schema over in the installing or updating transaction.  Nor
 *           is anything else this transaction wrote (the extension's rows,
 *           an OID next to the schema's): a schema made before and handed
 *           over looks the same.  Proof is that xmin together with this
 *           transaction having rewritten no row of pg_namespace, as the
 *           statistics count (they include counts of this session's
 *           earlier transactions not yet reported: those can only refuse).
 *           The guard's own rewrites (4) are not counted: it makes them
 *           only to a schema it has just accepted, so neither a later step
 *           in the same transaction nor a reinstall in the same session is
 *           refused for them;
 *        b. or, made before, when as committed no role but superusers (and,
 *           for a bundle, the installing role) owns it or may create in it.
 *           Transactions that began while it was open may still be
 *           creating, so the guard waits for every transaction of this
 *           database open when it looked (a prepared one is refused), and
 *           then looks with a new snapshot, which needs READ COMMITTED.
 *           On a Citus worker, where this script runs because the
 *           coordinator propagated CREATE (or ALTER) EXTENSION, the
 *           coordinator's backend also holds a superuser connection there
 *           in the same distributed transaction (it records pg_dist_object
 *           rows) when the installing role is not a superuser; that one
 *           cannot end before this statement does, so it is not waited
 *           for.  Only such a connection is spared: logged in as the
 *           superuser that owns extension citus (a role cannot forge its
 *           login), and carrying this backend's own distributed
 *           transaction (initiator, number, stamp and global pid, as
 *           get_all_active_transactions() shows them).  Citus's transaction
 *           ids can be set by any role (assign_distributed_transaction_id),
 *           so they only say which superuser connection, never whether;
 *           everything else is still waited for.
 *      Anything else is refused.
 *   3. Nothing foreign.  An object in schema lease that is not part of this
 *      extension (an overload of an internal helper or of an API function,
 *      an operator, a type, anything in any catalog that has a namespace)
 *      could capture a qualified reference below, or a caller's call, or
 *      make one ambiguous; so could a cast from, to or through its objects,
 *      and a trigger on its tables would run inside the API as superuser.
 *      The guard looks for all of them and refuses to go on, naming them.
 *      "Part of the extension" means a member of it, or an object a member
 *      owns internally (the table's row type and index), and in either case
 *      owned by the role running the script: the extension's owner, who is
 *      the installing role, may add objects of its own to the extension
 *      (ALTER EXTENSION ... ADD), and a CREATE OR REPLACE below would keep
 *      their owner.  A trigger is ours only when it calls one of our internal
 *      ("_") functions.  A bundle install, which has no extension, counts
 *      what the installing role owns.
 *   4. The schema.  Whoever owns schema lease can rename it or create
 *      objects in it, so the role that owns the functions takes it over,
 *      and every privilege that others hold on it is revoked.  Only USAGE
 *      is granted back, to PUBLIC.  The row is rewritten only to change it,
 *      so installing into the schema DROP EXTENSION left rewrites nothing,
 *      and with track_counts off where the script's role may set it (2a).
 *
 * After the guard, only the schema's owner can create objects in lease.
 */
SET LOCAL search_path = pg_catalog, pg_temp;

DO $guard$
DECLARE
    v_schema   oid := (SELECT n.oid FROM pg_catalog.pg_namespace AS n WHERE n.nspname = 'lease');
    v_ext      oid := (SELECT e.oid FROM pg_catalog.pg_extension AS e WHERE e.extname = 'pg_lease');
    v_me       oid := (SELECT r.oid FROM pg_catalog.pg_roles AS r WHERE r.rolname = current_user);
    v_db       oid := (SELECT d.oid FROM pg_catalog.pg_database AS d
                        WHERE d.datname = pg_catalog.current_database());
    v_top      xid8 := pg_catalog.pg_current_xact_id();  -- assigns ours, for age() below
    -- Rows of pg_namespace this transaction rewrote (see 2a), read before
    -- the guard rewrites any.
    v_rewrites bigint := pg_catalog.pg_stat_get_xact_tuples_updated('pg_catalog.pg_namespace'::pg_catalog.regclass);
    v_owner    oid;
    v_acl      pg_catalog.aclitem[];
    v_xmin     xid;
    v_age      integer;
    v_mine     boolean;
    v_counting text;
    v_counted  boolean;
    v_waitfor  text[];
    v_kin      integer[];
    v_wait_ms  bigint;
    v_deadline timestamptz;
    v_grantee  oid;
    v_foreign  text;
BEGIN
    IF v_schema IS NULL THEN
        RAISE EXCEPTION 'pg_lease: schema lease does not exist'
            USING ERRCODE = 'invalid_schema_name';
    END IF;
    SELECT n.nspowner, n.nspacl, n.xmin INTO v_owner, v_acl, v_xmin
      FROM pg_catalog.pg_namespace AS n WHERE n.oid = v_schema;

    -- 2. Did this transaction write the row we see?  A visible row whose
    -- xmin is in progress can only be ours: our top-level xid (age 0) or a
    -- subtransaction's, which is newer (age < 0).  An unfrozen xmin is
    -- within 2^31 of ours, so age places it exactly; a frozen one reads 2.
    v_age := pg_catalog.age(v_xmin);
    v_mine := v_age = 0
        OR (v_age < 0
            AND pg_catalog.pg_xact_status((v_top::text::bigint - v_age)::text::xid8) = 'in progress');

    IF v_mine THEN
        -- 2a.  Statistics are counted only with track_counts on, which only
        -- a superuser can turn off (or a role granted SET on it).
        v_counted := pg_catalog.current_setting('track_counts')::boolean;
        IF v_counted AND pg_catalog.to_regclass('pg_catalog.pg_parameter_acl') IS NOT NULL THEN
            EXECUTE 'SELECT NOT EXISTS (SELECT FROM pg_catalog.pg_roles AS r
                                         WHERE NOT r.rolsuper
                                           AND pg_catalog.has_parameter_privilege(r.oid, $1, $2))'
               INTO v_counted USING 'track_counts', 'SET';
        END IF;
        -- Counted rewrites are someone else's than the guard's (4), whoever
        -- ran them: a superuser handing the schema over in this transaction
        -- has left it as other sessions see it, open.
        IF NOT (v_counted AND v_rewrites = 0) THEN
            RAISE EXCEPTION 'pg_lease: schema lease was changed earlier in this transaction'
                USING ERRCODE = 'object_not_in_prerequisite_state',
                      DETAIL = 'Other sessions still see schema lease as it was before this transaction, '
                          || 'so whoever could create objects in it then still can, unseen. '
                          || CASE WHEN v_counted
                                  THEN 'This session rewrote ' || v_rewrites::text
                                       || ' row(s) of pg_namespace (a GRANT, REVOKE, ALTER SCHEMA or the like), '
                                       || 'in this transaction or moments before it.'
                                  ELSE 'track_counts is off or may be changed by roles that are not superusers, '
                                       || 'so the guard cannot tell whether this transaction made schema lease.'
                             END,
                      HINT = 'Commit the change to schema lease first; make sure no session that could create '
                          || 'objects in it is still in a transaction; then run this statement in a transaction '
                          || 'of its own, from a new session.';
        END IF;
        -- Made in this transaction: nobody else can see it.
    ELSE
        -- 2b.  As every other session sees it: closed to all but trusted roles?
        SELECT pg_catalog.string_agg(c.name, ', ' ORDER BY c.name)
          INTO v_foreign
          FROM (SELECT r.rolname::text AS name
                  FROM pg_catalog.pg_roles AS r
                 -- Trusted: superusers, roles that may SET ROLE to one (and,
                 -- for a bundle, the installing role and who may become it).
                 WHERE NOT EXISTS (
                           SELECT FROM pg_catalog.pg_roles AS t
                            WHERE (t.rolsuper OR (v_ext IS NULL AND t.oid = v_me))
                              AND (t.oid = r.oid
                                   OR pg_catalog.pg_has_role(r.oid, t.oid,
                                          CASE WHEN pg_catalog.current_setting('server_version_num')::integer >= 160000
                                               THEN 'SET' ELSE 'MEMBER' END)))
                   AND (r.oid = v_owner
                        OR (NOT EXISTS (SELECT FROM pg_catalog.aclexplode(v_acl) AS a
                                         WHERE a.grantee = 0 AND a.privilege_type = 'CREATE')
                            AND pg_catalog.has_schema_privilege(r.oid, v_schema, 'CREATE')))
                UNION
                SELECT 'PUBLIC'
                  FROM pg_catalog.aclexplode(v_acl) AS a
                 WHERE a.grantee = 0 AND a.privilege_type = 'CREATE') AS c;
        IF v_foreign IS NOT NULL THEN
            RAISE EXCEPTION 'pg_lease: schema lease existed before and is open to roles that are not superusers'
                USING ERRCODE = 'object_not_in_prerequisite_state',
                      DETAIL = 'These roles own it or may create objects in it: ' || v_foreign || '.',
                      HINT = 'When pg_lease is not installed, drop schema lease and let CREATE EXTENSION make it. '
                          || 'Otherwise give it to a superuser, revoke CREATE from those roles and commit that; '
                          || 'make sure none of their sessions is still in a transaction; then run this statement '
                          || 'again in a transaction of its own.';
        END IF;

        IF pg_catalog.current_setting('transaction_isolation') <> 'read committed' THEN
            RAISE EXCEPTION 'pg_lease: schema lease existed before this transaction, which must be READ COMMITTED'
                USING ERRCODE = 'object_not_in_prerequisite_state',
                      DETAIL = 'The guard looks for objects that other transactions committed after this one '
                          || 'began; at ' || pg_catalog.upper(pg_catalog.current_setting('transaction_isolation'))
                          || ' it would not see them.',
                      HINT = 'Run it in a READ COMMITTED transaction.';
        END IF;

        SELECT pg_catalog.string_agg(pg_catalog.format('%L (owner %s)', p.gid, p.owner), ', ' ORDER BY p.gid)
          INTO v_foreign
          FROM pg_catalog.pg_prepared_xacts AS p
         WHERE p.database = pg_catalog.current_database();
        IF v_foreign IS NOT NULL THEN
            RAISE EXCEPTION 'pg_lease: a prepared transaction of this database may be creating objects in schema lease'
                USING ERRCODE = 'object_not_in_prerequisite_state',
                      DETAIL = 'Prepared: ' || v_foreign || '.',
                      HINT = 'COMMIT PREPARED or ROLLBACK PREPARED them, and try again.';
        END IF;

        -- Citus (see 2b above): the superuser connections of the
        -- coordinator's backend that sent this statement, in this very
        -- distributed transaction.  get_all_active_transactions() is
        -- Citus's, in pg_catalog, and only where extension citus is.
        PERFORM pg_catalog.pg_stat_clear_snapshot();
        IF EXISTS (SELECT FROM pg_catalog.pg_extension AS e WHERE e.extname = 'citus')
           AND pg_catalog.to_regprocedure('pg_catalog.get_all_active_transactions()') IS NOT NULL THEN
            EXECUTE $citus$
                SELECT pg_catalog.array_agg(o.process_id)
                  FROM pg_catalog.get_all_active_transactions() AS m,
                       pg_catalog.get_all_active_transactions() AS o,
                       pg_catalog.pg_stat_activity AS s,
                       pg_catalog.pg_roles AS r,
                       pg_catalog.pg_extension AS e
                 WHERE m.process_id = pg_catalog.pg_backend_pid()
                   AND m.worker_query AND m.transaction_number <> 0
                   AND o.process_id <> m.process_id AND o.worker_query
                   AND o.datid = m.datid
                   AND o.initiator_node_identifier = m.initiator_node_identifier
                   AND o.transaction_number = m.transaction_number
                   AND o.transaction_stamp = m.transaction_stamp
                   AND o.global_pid = m.global_pid
                   AND s.pid = o.process_id AND s.datid = m.datid
                   AND e.extname = 'citus'
                   AND s.usesysid = e.extowner
                   AND r.oid = s.usesysid AND r.rolsuper
            $citus$ INTO v_kin;
        END IF;

        -- Every transaction of this database open now (its virtual xid is
        -- locked until it ends); ours excluded, and autovacuum's, which can
        -- run for hours and runs no client's statements (CREATE INDEX
        -- CONCURRENTLY does not wait for vacuums either), and the Citus
        -- connections just found.
        v_waitfor := ARRAY(
            SELECT l.virtualxid
              FROM pg_catalog.pg_locks AS l
              JOIN pg_catalog.pg_stat_activity AS s ON s.pid = l.pid
             WHERE l.locktype = 'virtualxid' AND l.mode = 'ExclusiveLock' AND l.granted
               AND l.pid <> pg_catalog.pg_backend_pid()
               AND s.datid = v_db
               AND s.backend_type <> 'autovacuum worker'
               AND l.pid <> ALL (coalesce(v_kin, '{}')));
        v_wait_ms := (SELECT s.setting::bigint FROM pg_catalog.pg_settings AS s WHERE s.name = 'lock_timeout');
        IF v_wait_ms = 0 THEN
            v_wait_ms := 60000;
        END IF;
        v_deadline := pg_catalog.clock_timestamp() + pg_catalog.make_interval(secs => v_wait_ms / 1000.0);
        LOOP
            SELECT pg_catalog.array_agg(l.pid)::text INTO v_foreign
              FROM pg_catalog.pg_locks AS l
             WHERE l.locktype = 'virtualxid' AND l.mode = 'ExclusiveLock' AND l.granted
               AND l.virtualxid = ANY (v_waitfor);
            EXIT WHEN v_foreign IS NULL;
            IF pg_catalog.clock_timestamp() >= v_deadline THEN
                PERFORM pg_catalog.pg_stat_clear_snapshot();
                SELECT pg_catalog.string_agg(
                           pg_catalog.format('pid %s (role %s, %s since %s)', s.pid,
                                             coalesce(s.usename::text, '?'), coalesce(s.state, s.backend_type),
                                             s.xact_start),
                           ', ' ORDER BY s.pid)
                  INTO v_foreign
                  FROM pg_catalog.pg_locks AS l
                  JOIN pg_catalog.pg_stat_activity AS s ON s.pid = l.pid
                 WHERE l.locktype = 'virtualxid' AND l.mode = 'ExclusiveLock' AND l.granted
                   AND l.virtualxid = ANY (v_waitfor);
                RAISE EXCEPTION 'pg_lease: other transactions in this database are still open'
                    USING ERRCODE = 'lock_not_available',
                          DETAIL = 'Schema lease existed before; a transaction that began while other roles '
                              || 'could create objects in it may still be adding some. Waited '
                              || v_wait_ms::text || ' ms for: ' || coalesce(v_foreign, '?') || '.',
                          HINT = 'End those transactions, or let them end, and try again; lock_timeout sets how '
                              || 'long to wait.';
            END IF;
            PERFORM pg_catalog.pg_sleep(0.01);
        END LOOP;
    END IF;

    -- 3. Refuse anything in the schema, or on its tables, that is not ours.
    WITH RECURSIVE ours (classid, objid) AS (
        SELECT d.classid, d.objid
          FROM pg_catalog.pg_depend AS d
         WHERE d.refclassid = 'pg_catalog.pg_extension'::pg_catalog.regclass
           AND d.refobjid = v_ext
           AND d.deptype = 'e'
        UNION
        SELECT d.classid, d.objid
          FROM pg_catalog.pg_depend AS d
          JOIN ours AS o ON d.refclassid = o.classid AND d.refobjid = o.objid
         WHERE d.deptype IN ('i', 'a')
    ), present (classid, objid, owner) AS (
        SELECT 'pg_catalog.pg_class'::pg_catalog.regclass, c.oid, c.relowner
          FROM pg_catalog.pg_class AS c WHERE c.relnamespace = v_schema
        UNION ALL
        SELECT 'pg_catalog.pg_proc'::pg_catalog.regclass, p.oid, p.proowner
          FROM pg_catalog.pg_proc AS p WHERE p.pronamespace = v_schema
        UNION ALL
        SELECT 'pg_catalog.pg_type'::pg_catalog.regclass, t.oid, t.typowner
          FROM pg_catalog.pg_type AS t WHERE t.typnamespace = v_schema
        UNION ALL
        SELECT 'pg_catalog.pg_operator'::pg_catalog.regclass, o.oid, o.oprowner
          FROM pg_catalog.pg_operator AS o WHERE o.oprnamespace = v_schema
        UNION ALL
        SELECT 'pg_catalog.pg_opclass'::pg_catalog.regclass, o.oid, o.opcowner
          FROM pg_catalog.pg_opclass AS o WHERE o.opcnamespace = v_schema
        UNION ALL
        SELECT 'pg_catalog.pg_opfamily'::pg_catalog.regclass, o.oid, o.opfowner
          FROM pg_catalog.pg_opfamily AS o WHERE o.opfnamespace = v_schema
        UNION ALL
        SELECT 'pg_catalog.pg_collation'::pg_catalog.regclass, c.oid, c.collowner
          FROM pg_catalog.pg_collation AS c WHERE c.collnamespace = v_schema
        UNION ALL
        SELECT 'pg_catalog.pg_conversion'::pg_catalog.regclass, c.oid, c.conowner
          FROM pg_catalog.pg_conversion AS c WHERE c.connamespace = v_schema
        UNION ALL
        SELECT 'pg_catalog.pg_statistic_ext'::pg_catalog.regclass, s.oid, s.stxowner
          FROM pg_catalog.pg_statistic_ext AS s WHERE s.stxnamespace = v_schema
        UNION ALL
        SELECT 'pg_catalog.pg_ts_config'::pg_catalog.regclass, c.oid, c.cfgowner
          FROM pg_catalog.pg_ts_config AS c WHERE c.cfgnamespace = v_schema
        UNION ALL
        SELECT 'pg_catalog.pg_ts_dict'::pg_catalog.regclass, d.oid, d.dictowner
          FROM pg_catalog.pg_ts_dict AS d WHERE d.dictnamespace = v_schema
        UNION ALL
        SELECT 'pg_catalog.pg_ts_parser'::pg_catalog.regclass, p.oid, NULL::oid
          FROM pg_catalog.pg_ts_parser AS p WHERE p.prsnamespace = v_schema
        UNION ALL
        SELECT 'pg_catalog.pg_ts_template'::pg_catalog.regclass, t.oid, NULL::oid
          FROM pg_catalog.pg_ts_template AS t WHERE t.tmplnamespace = v_schema
        UNION
        -- Members outside the schema: the owner check below applies to them.
        SELECT d.classid, d.objid,
               CASE d.classid
                   WHEN 'pg_catalog.pg_proc'::pg_catalog.regclass
                       THEN (SELECT p.proowner FROM pg_catalog.pg_proc AS p WHERE p.oid = d.objid)
                   WHEN 'pg_catalog.pg_class'::pg_catalog.regclass
                       THEN (SELECT c.relowner FROM pg_catalog.pg_class AS c WHERE c.oid = d.objid)
                   WHEN 'pg_catalog.pg_type'::pg_catalog.regclass
                       THEN (SELECT t.typowner FROM pg_catalog.pg_type AS t WHERE t.oid = d.objid)
                   WHEN 'pg_catalog.pg_operator'::pg_catalog.regclass
                       THEN (SELECT o.oprowner FROM pg_catalog.pg_operator AS o WHERE o.oid = d.objid)
                   WHEN 'pg_catalog.pg_namespace'::pg_catalog.regclass
                       THEN (SELECT n.nspowner FROM pg_catalog.pg_namespace AS n WHERE n.oid = d.objid)
               END
          FROM pg_catalog.pg_depend AS d
         WHERE d.refclassid = 'pg_catalog.pg_extension'::pg_catalog.regclass
           AND d.refobjid = v_ext
           AND d.deptype = 'e'
    ), foreign_objects (classid, objid) AS (
        SELECT p.classid, p.objid
          FROM present AS p
         WHERE (v_ext IS NOT NULL
                AND NOT EXISTS (SELECT FROM ours AS o WHERE o.classid = p.classid AND o.objid = p.objid))
            OR p.owner IS DISTINCT FROM v_me
        UNION ALL
        -- Triggers (a foreign key's too) on our tables: theirs unless they
        -- call one of our internal functions.  A trigger depends on its
        -- table automatically, so "ours" above would count it as ours.
        SELECT 'pg_catalog.pg_trigger'::pg_catalog.regclass, t.oid
          FROM pg_catalog.pg_trigger AS t
          JOIN pg_catalog.pg_class AS c ON c.oid = t.tgrelid
          LEFT JOIN pg_catalog.pg_proc AS f ON f.oid = t.tgfoid
         WHERE c.relnamespace = v_schema
           AND NOT (f.pronamespace IS NOT DISTINCT FROM v_schema
                    AND f.proname OPERATOR(pg_catalog.~) '^_'
                    AND f.proowner IS NOT DISTINCT FROM v_me
                    AND (v_ext IS NULL
                         OR EXISTS (SELECT FROM ours AS o
                                     WHERE o.classid = 'pg_catalog.pg_proc'::pg_catalog.regclass
                                       AND o.objid = f.oid)))
        UNION ALL
        -- Casts have no schema: those from, to or through our objects.
        SELECT 'pg_catalog.pg_cast'::pg_catalog.regclass, k.oid
          FROM pg_catalog.pg_cast AS k
         WHERE (k.castsource IN (SELECT t.oid FROM pg_catalog.pg_type AS t WHERE t.typnamespace = v_schema)
                OR k.casttarget IN (SELECT t.oid FROM pg_catalog.pg_type AS t WHERE t.typnamespace = v_schema)
                OR k.castfunc IN (SELECT p.oid FROM pg_catalog.pg_proc AS p WHERE p.pronamespace = v_schema))
           AND NOT (v_ext IS NOT NULL
                    AND EXISTS (SELECT FROM ours AS o
                                 WHERE o.classid = 'pg_catalog.pg_cast'::pg_catalog.regclass
                                   AND o.objid = k.oid))
    )
    SELECT pg_catalog.string_agg(pg_catalog.pg_describe_object(f.classid, f.objid, 0), ', '
                                 ORDER BY pg_catalog.pg_describe_object(f.classid, f.objid, 0))
      INTO v_foreign
      FROM foreign_objects AS f;

    IF v_foreign IS NOT NULL THEN
        RAISE EXCEPTION 'pg_lease: schema lease holds objects that are not part of pg_lease'
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  DETAIL = 'Found: ' || v_foreign || '.',
                  HINT = 'Drop them (or the schema, when pg_lease is not installed) and try again.';
    END IF;

    -- 4. Take the schema over and close it; rewrite its row only to change it,
    -- and uncounted (2a) where the role running the script may turn counting
    -- off: a superuser, so always but for a bundle install.
    IF (SELECT r.rolsuper FROM pg_catalog.pg_roles AS r WHERE r.oid = v_me) THEN
        v_counting := pg_catalog.current_setting('track_counts');
        PERFORM pg_catalog.set_config('track_counts', 'off', true);
    END IF;
    IF v_owner <> v_me THEN
        ALTER SCHEMA lease OWNER TO CURRENT_USER;
    END IF;
    FOR v_grantee IN
        SELECT DISTINCT a.grantee
          FROM pg_catalog.pg_namespace AS n,
               LATERAL pg_catalog.aclexplode(n.nspacl) AS a
         WHERE n.oid = v_schema
           AND a.grantee <> n.nspowner
           AND NOT (a.grantee = 0 AND a.privilege_type = 'USAGE' AND a.grantor = n.nspowner)
    LOOP
        EXECUTE 'REVOKE ALL ON SCHEMA lease FROM '
            || CASE v_grantee WHEN 0 THEN 'PUBLIC'
                              ELSE v_grantee::pg_catalog.regrole::text END  -- regrole quotes
            || ' CASCADE';
    END LOOP;
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_namespace AS n, LATERAL pg_catalog.aclexplode(n.nspacl) AS a
                    WHERE n.oid = v_schema AND a.grantee = 0 AND a.privilege_type = 'USAGE') THEN
        GRANT USAGE ON SCHEMA lease TO PUBLIC;
    END IF;
    IF v_counting IS NOT NULL THEN
        PERFORM pg_catalog.set_config('track_counts', v_counting, true);
    END IF;
END
$guard$;
