/*
 * Binding owners to database roles (§11, "Owners and roles"), off by default.
 *
 * An owner is a name the caller chooses; by default any role that may call
 * the API may renew or release any owner's lease.  An installation that
 * wants more can bind owners to roles: then a grant, renewal or release
 * for owner O is accepted only from a role that has the privileges of O's
 * role (pg_has_role USAGE: a member that inherits them, or one that has
 * SET ROLE to it; a membership granted WITH INHERIT FALSE, SET FALSE on
 * PostgreSQL 16+ does not count),
 * which is O up to its first '/' (so 'billing/worker-7' belongs to role
 * billing, and 'billing' alone too).  The calling role is the one the
 * session acts as: SET ROLE's role if set, else the session user (inside
 * the SECURITY DEFINER API, current_user is the extension's owner).
 *
 * It is enforced by a row trigger on lease.leases, which lease.bind_owners
 * creates or drops, so with binding off there is no cost at all.  Only
 * writes are checked: a denied acquire and a same-owner acquire write
 * nothing and hand nobody a grant (an epoch is no secret: inspect shows it).
 * Refused calls raise 42501 and change nothing.
 */
CREATE OR REPLACE FUNCTION lease._check_owner_binding()
    RETURNS trigger
    LANGUAGE plpgsql
    VOLATILE
    SET search_path = pg_catalog, pg_temp
AS $function$
DECLARE
    -- A release clears the owner: the owner acting is then the old one.
    v_owner  CONSTANT text := CASE WHEN TG_OP = 'UPDATE' AND NEW.owner IS NULL
                                   THEN OLD.owner ELSE NEW.owner END;
    v_caller CONSTANT text := lease._calling_role();
    v_role   text;
BEGIN
    IF v_owner IS NULL OR (TG_OP = 'UPDATE' AND NEW.owner IS NULL AND OLD.owner IS NULL) THEN
        RETURN NEW;
    END IF;
    -- lease.watch marks a key for a waiter: the grant itself is untouched.
    IF TG_OP = 'UPDATE' AND NEW.owner = OLD.owner AND NEW.epoch = OLD.epoch
       AND NEW.expires_at = OLD.expires_at THEN
        RETURN NEW;
    END IF;
    v_role := pg_catalog.split_part(v_owner, '/', 1);
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_roles AS r WHERE r.rolname = v_role)
       OR NOT pg_catalog.pg_has_role(v_caller, v_role, 'USAGE') THEN
        RAISE EXCEPTION 'pg_lease: owner "%" is not bound to role %', v_owner, v_caller
            USING ERRCODE = 'insufficient_privilege',
                  DETAIL = pg_catalog.format(
                      'Owners are bound to roles: owner "%s" belongs to role "%s", of which %s is not a member.',
                      v_owner, v_role, v_caller),
                  HINT = 'Use an owner of the form <role>/<name> for a role you are a member of.';
    END IF;
    RETURN NEW;
END;
$function$;

REVOKE ALL ON FUNCTION lease._check_owner_binding() FROM PUBLIC;

/*
 * lease._calling_role: the role the session acts as (SET ROLE, else the
 * session user), seen from inside SECURITY DEFINER code.
 */
CREATE OR REPLACE FUNCTION lease._calling_role()
    RETURNS text
    LANGUAGE sql
    STABLE PARALLEL SAFE
RETURN CASE WHEN pg_catalog.current_setting('role') = 'none'
            THEN session_user::text
            ELSE pg_catalog.current_setting('role') END;

REVOKE ALL ON FUNCTION lease._calling_role() FROM PUBLIC;

/*
 * lease.bind_owners(enabled): turns the binding on (true) or off (false), or
 * just reports it (NULL, the default); returns whether it is on afterwards.
 * Changing it is for superusers and members of the database owner's role:
 * it decides who may act for whom, database-wide.  Creating or dropping the
 * trigger locks lease.leases against writes for that moment.
 */
CREATE OR REPLACE FUNCTION lease.bind_owners(p_enabled boolean DEFAULT NULL)
    RETURNS boolean
    LANGUAGE plpgsql
    VOLATILE
    SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
AS $function$
DECLARE
    v_caller CONSTANT text := lease._calling_role();
BEGIN
    IF p_enabled IS NOT NULL THEN
        IF NOT pg_catalog.pg_has_role(
                   v_caller,
                   (SELECT d.datdba FROM pg_catalog.pg_database AS d
                     WHERE d.datname = pg_catalog.current_database()),
                   'USAGE')
           AND NOT (SELECT r.rolsuper FROM pg_catalog.pg_roles AS r WHERE r.rolname = v_caller) THEN
            RAISE EXCEPTION 'pg_lease: only the database owner may change the owner binding'
                USING ERRCODE = 'insufficient_privilege',
                      DETAIL = pg_catalog.format('%s is neither a superuser nor a member of the database owner''s role.', v_caller);
        END IF;
        PERFORM lease._begin_write('bind_owners'::text);
        DROP TRIGGER IF EXISTS leases_owner_binding ON lease.leases;
        IF p_enabled THEN
            CREATE TRIGGER leases_owner_binding
                BEFORE INSERT OR UPDATE ON lease.leases
                FOR EACH ROW EXECUTE FUNCTION lease._check_owner_binding();
            ALTER TABLE lease.leases ENABLE ALWAYS TRIGGER leases_owner_binding;
        END IF;
    END IF;
    RETURN EXISTS (SELECT FROM pg_catalog.pg_trigger AS t
                    WHERE t.tgrelid = 'lease.leases'::pg_catalog.regclass
                      AND t.tgname = 'leases_owner_binding');
END;
$function$;

COMMENT ON FUNCTION lease.bind_owners(boolean) IS
    'bind_owners(enabled => NULL): with true, owner "<role>/..." or "<role>" may only be granted, renewed or released by members of that role; '
    'false turns it off; NULL reports; database owner or superuser only';
