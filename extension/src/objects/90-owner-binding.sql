/*
 * Binding owners to database roles (§11, "Owners and roles"), off by default.
 *
 * An owner is a name the caller chooses; by default any role that may call
 * the API may renew or release any owner's lease.  An installation that
 * wants more can bind owners to roles: then a call that acts for owner O is
 * accepted only from a role that has the privileges of O's role
 * (pg_has_role USAGE: a member that inherits them, or one that has SET ROLE
 * to it; a membership granted WITH INHERIT FALSE, SET FALSE on PostgreSQL
 * 16+ does not count), which is O up to its first '/' (so
 * 'billing/worker-7' belongs to role billing, and 'billing' alone too).
 * The calling role is the one the session acts as: SET ROLE's role if set,
 * else the session user (inside the SECURITY DEFINER API, current_user is
 * the extension's owner).
 *
 * Who is checked (lease._act_for), with binding on:
 *   - acquire, renew, release (and so every batch) for the owner they name,
 *     before they look at the key; a refused call raises 42501 and changes
 *     nothing;
 *   - fence for the key's holder: a fence holds the holder's row lock until
 *     the fencing transaction ends, which stalls the holder's renew and
 *     release, so only a role that may act for the holder may take it;
 *   - watch marks a key only for such a role (lease._may_act_for); anyone
 *     else gets inspect's answer and notifies = false, and polls.
 *
 * The switch is the body of lease._owners_bound(), a constant that every
 * call inlines when it is planned: with binding off it costs nothing, and
 * turning it on or off takes no lock on lease.leases, so it never waits
 * for, nor makes anyone wait behind, a transaction that is using the table
 * (0.2.0 created a trigger, which queued every lease call behind any open
 * transaction that had written a lease).  Replacing the function
 * invalidates every session's plans that inlined it: every transaction
 * that starts after the switch commits sees the new setting, while one
 * that was already open may go on under the old one until it ends.
 */

/*
 * lease._set_owners_bound(bound): makes lease._owners_bound() return bound.
 * The one definition of that function: install, update and bind_owners all
 * come here.
 */
CREATE OR REPLACE FUNCTION lease._set_owners_bound(p_bound boolean)
    RETURNS void
    LANGUAGE plpgsql
    VOLATILE
    SET search_path = pg_catalog, pg_temp
AS $function$
BEGIN
    EXECUTE pg_catalog.format(
        'CREATE OR REPLACE FUNCTION lease._owners_bound() RETURNS boolean '
        'LANGUAGE sql IMMUTABLE PARALLEL SAFE RETURN %s',
        CASE WHEN p_bound THEN 'true' ELSE 'false' END);
    REVOKE ALL ON FUNCTION lease._owners_bound() FROM PUBLIC;
END;
$function$;

REVOKE ALL ON FUNCTION lease._set_owners_bound(boolean) FROM PUBLIC;

/*
 * The setting survives updates: an installation keeps what lease._owners_bound
 * said, and one coming from 0.2.0 keeps what its trigger meant (it existed
 * only while binding was on); the trigger and its function go.
 */
DO $carry_over$
DECLARE
    v_bound boolean := false;
BEGIN
    IF pg_catalog.to_regprocedure('lease._owners_bound()') IS NOT NULL THEN
        EXECUTE 'SELECT lease._owners_bound()' INTO v_bound;
    ELSIF EXISTS (SELECT FROM pg_catalog.pg_trigger AS t
                   WHERE t.tgrelid = 'lease.leases'::pg_catalog.regclass
                     AND t.tgname = 'leases_owner_binding') THEN
        v_bound := true;
    END IF;
    DROP TRIGGER IF EXISTS leases_owner_binding ON lease.leases;
    DROP FUNCTION IF EXISTS lease._check_owner_binding();
    PERFORM lease._set_owners_bound(v_bound);
END
$carry_over$;

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
 * lease._may_act_for(owner): the calling role may act for owner (always,
 * with binding off).  An owner naming a role that does not exist is
 * nobody's.
 */
CREATE OR REPLACE FUNCTION lease._may_act_for(p_owner text)
    RETURNS boolean
    LANGUAGE sql
    STABLE
RETURN NOT lease._owners_bound()
    OR (EXISTS (SELECT FROM pg_catalog.pg_roles AS r
                 WHERE r.rolname = pg_catalog.split_part(p_owner COLLATE pg_catalog."C", '/', 1))
        AND pg_catalog.pg_has_role(lease._calling_role(),
                                   pg_catalog.split_part(p_owner COLLATE pg_catalog."C", '/', 1), 'USAGE'));

REVOKE ALL ON FUNCTION lease._may_act_for(text) FROM PUBLIC;

/*
 * lease._act_for(owner): raises 42501 unless the calling role may act for
 * owner.
 */
CREATE OR REPLACE FUNCTION lease._act_for(p_owner text)
    RETURNS void
    LANGUAGE plpgsql
    STABLE
    SET search_path = pg_catalog, pg_temp
AS $function$
BEGIN
    IF p_owner IS NOT NULL AND NOT lease._may_act_for(p_owner) THEN
        RAISE EXCEPTION 'pg_lease: owner % is not bound to role %', lease._quoted(p_owner), lease._calling_role()
            USING ERRCODE = 'insufficient_privilege',
                  DETAIL = pg_catalog.format(
                      'Owners are bound to roles: owner %s belongs to role "%s", of which %s is not a member.',
                      lease._quoted(p_owner), pg_catalog.split_part(p_owner COLLATE pg_catalog."C", '/', 1),
                      lease._calling_role()),
                  HINT = 'Use an owner of the form <role>/<name> for a role you are a member of.';
    END IF;
END;
$function$;

REVOKE ALL ON FUNCTION lease._act_for(text) FROM PUBLIC;

/*
 * lease._may_administer(role): role is a superuser or a member of the
 * database owner's role: who may switch the owner binding
 * (lease.bind_owners), and, while owners are bound, who may set a key's
 * limit (lease.set_limit, 45-permits.sql), which decides for every role
 * whether lease.acquire of that key is exclusive.
 */
CREATE OR REPLACE FUNCTION lease._may_administer(p_role text)
    RETURNS boolean
    LANGUAGE sql
    STABLE
RETURN pg_catalog.pg_has_role(
           p_role,
           (SELECT d.datdba FROM pg_catalog.pg_database AS d
             WHERE d.datname = pg_catalog.current_database()),
           'USAGE')
    OR COALESCE((SELECT r.rolsuper FROM pg_catalog.pg_roles AS r WHERE r.rolname = p_role), false);

REVOKE ALL ON FUNCTION lease._may_administer(text) FROM PUBLIC;

/*
 * lease.bind_owners(enabled): turns the binding on (true) or off (false), or
 * just reports it (NULL, the default); returns whether it is on afterwards.
 * Changing it is for superusers and members of the database owner's role:
 * it decides who may act for whom, database-wide.  It takes effect when
 * the calling transaction commits.
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
    IF p_enabled IS NULL THEN
        RETURN lease._owners_bound();
    END IF;
    IF NOT lease._may_administer(v_caller) THEN
        RAISE EXCEPTION 'pg_lease: only the database owner may change the owner binding'
            USING ERRCODE = 'insufficient_privilege',
                  DETAIL = pg_catalog.format('%s is neither a superuser nor a member of the database owner''s role.', v_caller);
    END IF;
    PERFORM lease._begin_write('bind_owners');
    -- Two switches at once would both rewrite the function's catalog row,
    -- and the second would fail ("tuple concurrently updated"): take them
    -- in turn.  No lease call takes a lock this mode conflicts with.
    LOCK TABLE lease.epoch_floor IN SHARE UPDATE EXCLUSIVE MODE;
    PERFORM lease._set_owners_bound(p_enabled);
    RETURN p_enabled;
END;
$function$;

COMMENT ON FUNCTION lease.bind_owners(boolean) IS
    'bind_owners(p_enabled => NULL): with true, owner "<role>/..." or "<role>" may only be granted, renewed or released by members of that role, '
    'and only they may fence or watch its keys; false turns it off; NULL reports; database owner or superuser only';
