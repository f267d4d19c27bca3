/**
 * SEMANTICS.md §11 "Owners and roles": owners are a caller convention unless an installation
 * binds them to roles with lease.bind_owners(true); then only members of an owner's role may
 * grant, renew or release for it, and everything else raises 42501 and changes nothing.
 */
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import type pg from 'pg';
import { defaultOwner } from '../../src/index.js';
import { createTestDatabase, type TestDatabase } from '../support/database.js';
import { uniqueKey } from '../support/helpers.js';
import { pgError, storedRow } from '../support/lease-calls.js';
import { createRole, type TestRole } from '../support/roles.js';

let db: TestDatabase;
let alice: TestRole;
let bob: TestRole;
let team: string;
let asAlice: pg.Client;
let asBob: pg.Client;

before(async () => {
  db = await createTestDatabase();
  alice = await createRole(db);
  bob = await createRole(db);
  team = `team_${alice.name}`;
  await db.pool.query(`CREATE ROLE ${team} NOLOGIN`);
  await db.pool.query(`GRANT ${team} TO ${alice.name}`);
  asAlice = await alice.connect();
  asBob = await bob.connect();
});
after(async () => {
  await db.pool.query('SELECT lease.bind_owners(false)');
  await alice.drop();
  await bob.drop();
  await db.pool.query(`DROP ROLE ${team}`);
  await db.close();
});

async function bound(on: boolean): Promise<void> {
  const { rows } = await db.pool.query('SELECT lease.bind_owners($1) AS on', [on]);
  assert.equal(rows[0].on, on);
}

describe('owners bound to roles', { concurrency: false }, () => {
  test('is off by default: any role may release any owner\'s lease', async () => {
    const { rows } = await asBob.query('SELECT lease.bind_owners() AS on');
    assert.equal(rows[0].on, false);
    const key = uniqueKey('unbound');
    await asAlice.query(`SELECT lease.acquire($1, $2, '1 min')`, [key, `${alice.name}/w`]);
    const released = await asBob.query(`SELECT status FROM lease.release($1, $2, 1)`, [
      key,
      `${alice.name}/w`,
    ]);
    assert.equal(released.rows[0].status, 'ok');
  });

  test('only a superuser or the database owner may turn it on or off', async () => {
    const error = await pgError(asBob.query('SELECT lease.bind_owners(true)'));
    assert.equal(error.code, '42501');
    assert.match(error.message, /only the database owner may change the owner binding/);
    const { rows } = await db.pool.query('SELECT lease.bind_owners() AS on');
    assert.equal(rows[0].on, false);
  });

  test('when on, a role grants, renews and releases for its own owners and its groups', async () => {
    await bound(true);
    try {
      for (const owner of [alice.name, `${alice.name}/worker-1`, `${team}/worker-2`]) {
        const key = uniqueKey('bound-ok');
        const granted = await asAlice.query(
          `SELECT acquired, epoch FROM lease.acquire($1, $2, '1 min')`,
          [key, owner],
        );
        assert.deepEqual(granted.rows[0], { acquired: true, epoch: '1' });
        const renewed = await asAlice.query(
          `SELECT status FROM lease.renew($1, $2, 1, '1 min')`,
          [key, owner],
        );
        assert.equal(renewed.rows[0].status, 'ok');
        const released = await asAlice.query(`SELECT status FROM lease.release($1, $2, 1)`, [
          key,
          owner,
        ]);
        assert.equal(released.rows[0].status, 'ok');
      }
    } finally {
      await bound(false);
    }
  });

  test("when on, another role can neither take, renew nor release for an owner, and nothing changes", async () => {
    const key = uniqueKey('bound-refused');
    const owner = `${alice.name}/worker`;
    await bound(true);
    try {
      const taken = await pgError(
        asBob.query(`SELECT lease.acquire($1, $2, '1 min')`, [key, owner]),
      );
      assert.equal(taken.code, '42501');
      assert.match(taken.detail ?? '', new RegExp(`belongs to role "${alice.name}"`));
      assert.equal(await storedRow(db.pool, key), undefined);

      await asAlice.query(`SELECT lease.acquire($1, $2, '1 min')`, [key, owner]);
      const before = await storedRow(db.pool, key);
      for (const call of [
        `SELECT lease.renew($1, $2, 1, '1 microsecond')`,
        `SELECT lease.release($1, $2, 1)`,
      ]) {
        const refused = await pgError(asBob.query(call, [key, owner]));
        assert.equal(refused.code, '42501');
      }
      assert.deepEqual(await storedRow(db.pool, key), before);
      // An owner naming a role that does not exist is nobody's.
      const ghost = await pgError(
        asAlice.query(`SELECT lease.acquire($1, 'no_such_role/x', '1 min')`, [uniqueKey('ghost')]),
      );
      assert.equal(ghost.code, '42501');
      // The client's defaultOwner({ role }) makes owners of the bound form.
      const named = await asAlice.query(`SELECT acquired FROM lease.acquire($1, $2, '1 min')`, [
        uniqueKey('default-owner'),
        defaultOwner({ role: team }),
      ]);
      assert.equal(named.rows[0].acquired, true);
    } finally {
      await bound(false);
    }
  });

  test('when on, SET ROLE decides which role acts', async () => {
    await db.pool.query(`GRANT ${bob.name} TO ${alice.name}`);
    await bound(true);
    try {
      await asAlice.query(`SET ROLE ${bob.name}`);
      const asBobOwner = await asAlice.query(`SELECT acquired FROM lease.acquire($1, $2, '1 min')`, [
        uniqueKey('set-role'),
        `${bob.name}/w`,
      ]);
      assert.equal(asBobOwner.rows[0].acquired, true);
      const teamOwner = await pgError(
        asAlice.query(`SELECT lease.acquire($1, $2, '1 min')`, [uniqueKey('set-role'), `${team}/w`]),
      );
      assert.equal(teamOwner.code, '42501');
    } finally {
      await asAlice.query('RESET ROLE');
      await bound(false);
      await db.pool.query(`REVOKE ${bob.name} FROM ${alice.name}`);
    }
  });

  test('when on, a member that does not inherit the role acts for it only after SET ROLE', async () => {
    const carol = await createRole(db);
    await db.pool.query(`ALTER ROLE ${carol.name} NOINHERIT`);
    await db.pool.query(`GRANT ${team} TO ${carol.name}`);
    const asCarol = await carol.connect();
    await bound(true);
    try {
      const refused = await pgError(
        asCarol.query(`SELECT lease.acquire($1, $2, '1 min')`, [uniqueKey('noinherit'), `${team}/w`]),
      );
      assert.equal(refused.code, '42501');
      await asCarol.query(`SET ROLE ${team}`);
      const { rows } = await asCarol.query(`SELECT acquired FROM lease.acquire($1, $2, '1 min')`, [
        uniqueKey('noinherit'),
        `${team}/w`,
      ]);
      assert.equal(rows[0].acquired, true);
    } finally {
      await bound(false);
      await carol.drop();
    }
  });

  test('when on, a shared grant (§13) is made, renewed and released only for an owner the caller may act for', async () => {
    const key = uniqueKey('bound-shared');
    await bound(true);
    try {
      const granted = await asAlice.query(
        `SELECT acquired, epoch::text FROM lease.acquire_shared($1, $2, '1 min')`,
        [key, alice.name],
      );
      assert.equal(granted.rows[0].acquired, true);
      const epoch = granted.rows[0].epoch as string;
      const taken = await pgError(
        asBob.query(`SELECT lease.acquire_shared($1, $2, '1 min')`, [key, `${alice.name}/x`]),
      );
      assert.equal(taken.code, '42501');
      for (const sql of [
        `SELECT lease.renew($1, $2, $3, '1 min')`,
        `SELECT lease.release($1, $2, $3)`,
      ]) {
        assert.equal((await pgError(asBob.query(sql, [key, alice.name, epoch]))).code, '42501');
      }
      assert.equal(
        (await pgError(asBob.query('SELECT lease.fence($1, $2)', [key, epoch]))).code,
        '42501',
      );
      const released = await asAlice.query(`SELECT status FROM lease.release($1, $2, $3)`, [
        key,
        alice.name,
        epoch,
      ]);
      assert.equal(released.rows[0].status, 'ok');
    } finally {
      await bound(false);
    }
  });

  test('turned off again, the binding no longer applies', async () => {
    await bound(true);
    await bound(false);
    const key = uniqueKey('off-again');
    const { rows } = await asBob.query(`SELECT acquired FROM lease.acquire($1, $2, '1 min')`, [
      key,
      `${alice.name}/w`,
    ]);
    assert.equal(rows[0].acquired, true);
  });
});
