/*
 * Privileges, last in every script (§1, §10).  Each object above revokes
 * PUBLIC's rights where it must, but that is not all an object can carry:
 * default privileges (ALTER DEFAULT PRIVILEGES, by a superuser for its own
 * objects, or by the installing role in a bundle install) add grants when
 * an object is created, and a 0.1.0 installation may hold grants made
 * since.  So every relation, domain and function in schema lease ends with
 * exactly these: its owner's, and EXECUTE for PUBLIC on the API (the functions
 * whose names do not start with "_"; lease.purge instead keeps EXECUTE for
 * the extension's owner and whom it granted it to); nobody may read or
 * write the table directly.  A fresh install and an update therefore end alike.
 */
DO $privileges$
DECLARE
    v_object record;
BEGIN
    FOR v_object IN
        SELECT 'TABLE ' || c.oid::pg_catalog.regclass::text AS name,
               CASE a.grantee WHEN 0 THEN 'PUBLIC' ELSE a.grantee::pg_catalog.regrole::text END AS grantee
          FROM pg_catalog.pg_class AS c
          CROSS JOIN LATERAL pg_catalog.aclexplode(c.relacl) AS a
         WHERE c.relnamespace = 'lease'::pg_catalog.regnamespace
           AND c.relkind IN ('r', 'v', 'm', 'S', 'f', 'p')
           AND a.grantee <> c.relowner
        UNION
        SELECT 'FUNCTION ' || p.oid::pg_catalog.regprocedure::text,
               CASE a.grantee WHEN 0 THEN 'PUBLIC' ELSE a.grantee::pg_catalog.regrole::text END
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
        -- The table's domains: a column of another role's table of one of them
        -- would make DROP EXTENSION fail (or take that column with CASCADE).
        SELECT 'DOMAIN ' || t.oid::pg_catalog.regtype::text,
               CASE a.grantee WHEN 0 THEN 'PUBLIC' ELSE a.grantee::pg_catalog.regrole::text END
          FROM pg_catalog.pg_type AS t
          CROSS JOIN LATERAL pg_catalog.aclexplode(
                   COALESCE(t.typacl, pg_catalog.acldefault('T', t.typowner))) AS a
         WHERE t.typnamespace = 'lease'::pg_catalog.regnamespace
           AND t.typtype = 'd'
           AND a.grantee <> t.typowner
    LOOP
        EXECUTE 'REVOKE ALL ON ' || v_object.name || ' FROM ' || v_object.grantee || ' CASCADE';
    END LOOP;
END
$privileges$;
