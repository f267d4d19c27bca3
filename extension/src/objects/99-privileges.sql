/*
 * Privileges, last in every script (§1, §10).  Each object above revokes
 * PUBLIC's rights where it must, but that is not all an object can carry:
 * default privileges (ALTER DEFAULT PRIVILEGES, by a superuser for its own
 * objects, or by the installing role in a bundle install) add grants when
 * an object is created, and an installation of an earlier version may hold
 * grants made since, on the table or on single columns of it.  So every ACL
 * an object in schema lease can carry ends with exactly these entries:
 *
 *   schema lease   its owner's, and USAGE for PUBLIC;
 *   relations      their owner's, and none on any column: nobody may read
 *                  or write the tables directly (REVOKE ... ON TABLE also
 *                  revokes the grantee's column privileges);
 *   routines       their owner's, and EXECUTE for PUBLIC on the API (the
 *                  functions whose names do not start with "_");
 *                  lease.purge instead keeps EXECUTE for the extension's
 *                  owner and whom it granted it to;
 *   types          their owner's: the domains and the tables' row types,
 *                  PUBLIC's default USAGE included, since a column, cast or
 *                  function of another role on one of them would make DROP
 *                  EXTENSION fail (or take that object with CASCADE).  Array
 *                  and multirange types carry no privileges of their own.
 *
 * Large objects are not in any schema and cannot be members of an
 * extension; pg_lease has none.  A fresh install and an update therefore end
 * alike.  The reset is checked afterwards: a grant it could not revoke
 * fails the script rather than survive it.
 */
DO $privileges$
DECLARE
    -- Every ACL entry in schema lease that should not be there: what to
    -- name in REVOKE, and to whom.
    v_wrong CONSTANT text := $wrong$
        SELECT CASE c.relkind WHEN 'S' THEN 'SEQUENCE ' ELSE 'TABLE ' END
                   || c.oid::pg_catalog.regclass::text AS name,
               a.grantee
          FROM pg_catalog.pg_class AS c
          CROSS JOIN LATERAL pg_catalog.aclexplode(c.relacl) AS a
         WHERE c.relnamespace = 'lease'::pg_catalog.regnamespace
           AND a.grantee <> c.relowner
        UNION
        SELECT 'TABLE ' || c.oid::pg_catalog.regclass::text, a.grantee
          FROM pg_catalog.pg_attribute AS t
          JOIN pg_catalog.pg_class AS c ON c.oid = t.attrelid
          CROSS JOIN LATERAL pg_catalog.aclexplode(t.attacl) AS a
         WHERE c.relnamespace = 'lease'::pg_catalog.regnamespace
           AND a.grantee <> c.relowner
        UNION
        SELECT 'ROUTINE ' || p.oid::pg_catalog.regprocedure::text, a.grantee
          FROM pg_catalog.pg_proc AS p
          CROSS JOIN LATERAL pg_catalog.aclexplode(
                   COALESCE(p.proacl, pg_catalog.acldefault('f', p.proowner))) AS a
         WHERE p.pronamespace = 'lease'::pg_catalog.regnamespace
           AND a.grantee <> p.proowner
           AND NOT (a.grantee = 0 AND a.privilege_type = 'EXECUTE' AND p.proname !~ '^_')
           -- lease.purge is not PUBLIC's: it keeps its grant to the extension's
           -- owner and the grants that owner made with it (80-list-purge.sql).
           AND NOT (p.oid = 'lease.purge(interval, pg_catalog.int8)'::pg_catalog.regprocedure
                    AND (a.grantor <> p.proowner
                         OR a.grantee = (SELECT e.extowner FROM pg_catalog.pg_extension AS e
                                          WHERE e.extname = 'pg_lease')))
        UNION
        SELECT CASE t.typtype WHEN 'd' THEN 'DOMAIN ' ELSE 'TYPE ' END || t.oid::pg_catalog.regtype::text,
               a.grantee
          FROM pg_catalog.pg_type AS t
          CROSS JOIN LATERAL pg_catalog.aclexplode(
                   COALESCE(t.typacl, pg_catalog.acldefault('T', t.typowner))) AS a
         WHERE t.typnamespace = 'lease'::pg_catalog.regnamespace
           AND t.typtype <> 'm'
           AND NOT (t.typelem <> 0 AND t.typsubscript = 'pg_catalog.array_subscript_handler'::pg_catalog.regproc)
           AND a.grantee <> t.typowner
        UNION
        SELECT 'SCHEMA lease', a.grantee
          FROM pg_catalog.pg_namespace AS n
          CROSS JOIN LATERAL pg_catalog.aclexplode(n.nspacl) AS a
         WHERE n.oid = 'lease'::pg_catalog.regnamespace
           AND a.grantee <> n.nspowner
           AND NOT (a.grantee = 0 AND a.privilege_type = 'USAGE' AND a.grantor = n.nspowner)
    $wrong$;
    v_object record;
    v_left   text;
BEGIN
    FOR v_object IN EXECUTE v_wrong LOOP
        EXECUTE 'REVOKE ALL ON ' || v_object.name || ' FROM '
            || CASE v_object.grantee WHEN 0 THEN 'PUBLIC'
                                     ELSE v_object.grantee::pg_catalog.regrole::text END  -- regrole quotes
            || ' CASCADE';
    END LOOP;
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_namespace AS n, LATERAL pg_catalog.aclexplode(n.nspacl) AS a
                    WHERE n.oid = 'lease'::pg_catalog.regnamespace
                      AND a.grantee = 0 AND a.privilege_type = 'USAGE') THEN
        GRANT USAGE ON SCHEMA lease TO PUBLIC;
    END IF;

    EXECUTE 'SELECT pg_catalog.string_agg(w.name || '' to ''
                    || CASE w.grantee WHEN 0 THEN ''PUBLIC'' ELSE w.grantee::pg_catalog.regrole::text END,
                    '', '' ORDER BY w.name, w.grantee)
               FROM (' || v_wrong || ') AS w'
       INTO v_left;
    IF v_left IS NOT NULL THEN
        RAISE EXCEPTION 'pg_lease: privileges in schema lease that could not be revoked'
            USING ERRCODE = 'insufficient_privilege',
                  DETAIL = 'Still granted: ' || v_left || '.',
                  HINT = 'Revoke them as their grantor, and try again.';
    END IF;
END
$privileges$;
