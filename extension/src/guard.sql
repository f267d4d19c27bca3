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
 *   2. The schema.  Whoever owns schema lease can rename it or create
 *      objects in it, so the role that owns the functions takes it over,
 *      and every privilege that others hold on it is revoked (a schema
 *      made beforehand may carry GRANT CREATE ... TO PUBLIC).  Only USAGE
 *      is granted back, to PUBLIC.
 *   3. Nothing foreign.  An object in schema lease that is not part of this
 *      extension (an overload of an internal helper or of an API function,
 *      an operator, a type, anything in any catalog that has a namespace)
 *      could capture a qualified reference below, or a caller's call, or
 *      make one ambiguous.  The guard looks for one in every such catalog
 *      and refuses to go on, naming them.  "Part of the extension" means a
 *      member of it, or an object a member owns internally (the table's row
 *      type and index), and in either case owned by the role running the
 *      script: the extension's owner, who is the installing role, may add
 *      objects of its own to the extension (ALTER EXTENSION ... ADD), and a
 *      CREATE OR REPLACE below would keep their owner.  A bundle install,
 *      which has no extension, counts what the installing role owns.
 *   4. Nobody creating unseen.  The check sees committed objects and this
 *      transaction's own.  An object that another session creates in a
 *      transaction still open would appear after it, in a schema taken to
 *      be safe.  So a schema lease that this transaction did not create is
 *      accepted only when no role but superusers (and, for a bundle, the
 *      installing role itself) owns it or may create in it: for instance
 *      the empty schema DROP EXTENSION leaves behind.  Anything else is
 *      refused with a HINT; a script cannot wait for other sessions.
 *
 * After the guard, only the schema's owner can create objects in lease.
 */
SET LOCAL search_path = pg_catalog, pg_temp;

DO $guard$
DECLARE
    v_schema  oid := (SELECT n.oid FROM pg_catalog.pg_namespace AS n WHERE n.nspname = 'lease');
    v_ext     oid := (SELECT e.oid FROM pg_catalog.pg_extension AS e WHERE e.extname = 'pg_lease');
    v_xmin    xid := (SELECT n.xmin FROM pg_catalog.pg_namespace AS n WHERE n.oid = v_schema);
    v_top     xid8 := pg_catalog.pg_current_xact_id();
    v_grantee oid;
    v_foreign text;
BEGIN
    IF v_schema IS NULL THEN
        RAISE EXCEPTION 'pg_lease: schema lease does not exist'
            USING ERRCODE = 'invalid_schema_name';
    END IF;

    -- 4. A schema made before this transaction (its row's xmin is neither
    -- this transaction nor, being newer than it and still in progress, one
    -- of its subtransactions) must be closed to all but trusted roles.
    IF v_xmin <> pg_catalog.xid(v_top)
       AND NOT (pg_catalog.age(v_xmin) < 0
                AND pg_catalog.pg_xact_status(
                        (((v_top::text::bigint >> 32) << 32) + v_xmin::text::bigint)::text::xid8)
                    = 'in progress') THEN
        SELECT pg_catalog.string_agg(DISTINCT c.name, ', ')
          INTO v_foreign
          FROM (SELECT r.rolname::text AS name, r.rolsuper
                  FROM pg_catalog.pg_namespace AS n
                  JOIN pg_catalog.pg_roles AS r ON r.oid = n.nspowner
                 WHERE n.oid = v_schema
                UNION ALL
                SELECT CASE a.grantee WHEN 0 THEN 'PUBLIC' ELSE r.rolname::text END,
                       coalesce(r.rolsuper, false)
                  FROM pg_catalog.pg_namespace AS n
                  CROSS JOIN LATERAL pg_catalog.aclexplode(n.nspacl) AS a
                  LEFT JOIN pg_catalog.pg_roles AS r ON r.oid = a.grantee
                 WHERE n.oid = v_schema AND a.privilege_type = 'CREATE') AS c
         WHERE NOT c.rolsuper
           AND c.name <> current_user::text;
        IF v_foreign IS NOT NULL THEN
            RAISE EXCEPTION 'pg_lease: schema lease existed before and is open to roles that are not superusers'
                USING ERRCODE = 'object_not_in_prerequisite_state',
                      DETAIL = 'These roles own it or may create objects in it: ' || v_foreign || '.',
                      HINT = 'When pg_lease is not installed, drop schema lease and let CREATE EXTENSION make it. '
                          || 'Otherwise give it to a superuser, revoke CREATE from those roles, make sure none of '
                          || 'their sessions is still in a transaction, and try again.';
        END IF;
    END IF;

    -- 2. Take the schema over and close it.
    ALTER SCHEMA lease OWNER TO CURRENT_USER;
    FOR v_grantee IN
        SELECT DISTINCT a.grantee
          FROM pg_catalog.pg_namespace AS n,
               LATERAL pg_catalog.aclexplode(n.nspacl) AS a
         WHERE n.oid = v_schema
           AND a.grantee <> n.nspowner
    LOOP
        EXECUTE 'REVOKE ALL ON SCHEMA lease FROM '
            || CASE v_grantee WHEN 0 THEN 'PUBLIC'
                              ELSE v_grantee::pg_catalog.regrole::text END  -- regrole quotes
            || ' CASCADE';
    END LOOP;
    GRANT USAGE ON SCHEMA lease TO PUBLIC;

    -- 3. Refuse anything in the schema that is not ours.
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
    )
    SELECT pg_catalog.string_agg(pg_catalog.pg_describe_object(p.classid, p.objid, 0), ', '
                                 ORDER BY pg_catalog.pg_describe_object(p.classid, p.objid, 0))
      INTO v_foreign
      FROM present AS p
     WHERE (v_ext IS NOT NULL
            AND NOT EXISTS (SELECT FROM ours AS o WHERE o.classid = p.classid AND o.objid = p.objid))
        OR p.owner IS DISTINCT FROM current_user::pg_catalog.regrole::oid;

    IF v_foreign IS NOT NULL THEN
        RAISE EXCEPTION 'pg_lease: schema lease holds objects that are not part of pg_lease'
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  DETAIL = 'Found: ' || v_foreign || '.',
                  HINT = 'Drop them (or the schema, when pg_lease is not installed) and try again.';
    END IF;
END
$guard$;
