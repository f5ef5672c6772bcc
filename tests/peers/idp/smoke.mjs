// Smoke test of the test IdP: starts server.mjs on a free port and acts as a relying party with
// plain fetch and a cookie jar of its own. `node smoke.mjs`; exits non-zero on the first failure.

import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { createHash, randomBytes } from 'node:crypto';
import { createServer } from 'node:net';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

import * as jose from 'jose';

const here = dirname(fileURLToPath(import.meta.url));
const CLIENT_ID = 'capstan-test';
const CLIENT_SECRET = 'smoke-secret';
const REDIRECT_URI = 'http://127.0.0.1:9/callback'; // never contacted: redirects are followed by hand
const PASSWORD = 'correct horse battery staple';

let failed = false;
let step = 0;
async function check(name, fn) {
  step += 1;
  try {
    await fn();
    console.log(`ok ${step} ${name}`);
  } catch (err) {
    failed = true;
    console.log(`not ok ${step} ${name}\n  ${String(err.stack ?? err).split('\n').join('\n  ')}`);
    process.exit(1);
  }
}

function freePort() {
  return new Promise((resolve, reject) => {
    const s = createServer();
    s.once('error', reject);
    s.listen(0, '127.0.0.1', () => {
      const { port } = s.address();
      s.close(() => resolve(port));
    });
  });
}

// ---------------------------------------------------------------------------------------------
// start the IdP

const port = await freePort();
const child = spawn(process.execPath, [join(here, 'server.mjs'),
  '--port', String(port), '--client-id', CLIENT_ID, '--client-secret', CLIENT_SECRET,
  '--redirect-uri', REDIRECT_URI, '--redirect-uri', 'http://localhost:9/other'],
{ stdio: ['ignore', 'pipe', 'pipe'] });
let stderr = '';
child.stderr.on('data', (d) => { stderr += d; });
const issuer = await new Promise((resolve, reject) => {
  let out = '';
  const timer = setTimeout(() => reject(new Error(`no ready line within 15 s; stderr:\n${stderr}`)), 15000);
  child.stdout.on('data', (d) => {
    out += d;
    const m = /^idp listening on (\S+)\n/m.exec(out);
    if (m) { clearTimeout(timer); resolve(m[1]); }
  });
  child.once('exit', (code) => reject(new Error(`server exited ${code}; stderr:\n${stderr}`)));
});
const childExit = new Promise((resolve) => child.once('exit', (code, signal) => resolve({ code, signal })));

function stopChild() {
  if (child.exitCode === null) child.kill('SIGTERM');
}
process.on('exit', stopChild);

// ---------------------------------------------------------------------------------------------
// a browser: cookie jar (by name; one host) and redirects followed by hand

class Browser {
  constructor() { this.cookies = new Map(); }

  cookieHeader() {
    return [...this.cookies].map(([k, v]) => `${k}=${v}`).join('; ');
  }

  store(res) {
    for (const c of res.headers.getSetCookie()) {
      const [pair, ...attrs] = c.split(';').map((s) => s.trim());
      const i = pair.indexOf('=');
      const name = pair.slice(0, i);
      const value = pair.slice(i + 1);
      const expired = attrs.some((a) => /^expires=/i.test(a) && new Date(a.slice(8)) < new Date())
        || attrs.some((a) => /^max-age=0$/i.test(a));
      if (expired || value === '') this.cookies.delete(name); else this.cookies.set(name, value);
    }
  }

  async request(url, init = {}) {
    const headers = { ...(init.headers ?? {}) };
    if (this.cookies.size) headers.cookie = this.cookieHeader();
    const res = await fetch(url, { ...init, headers, redirect: 'manual' });
    this.store(res);
    return res;
  }

  // follows redirects until one points at the redirect URI (returned, not fetched)
  async follow(url, init = {}) {
    let res = await this.request(url, init);
    for (let hops = 0; hops < 20; hops += 1) {
      if (res.status < 300 || res.status > 399) return { res };
      const location = new URL(res.headers.get('location'), url).href;
      if (location.startsWith(REDIRECT_URI)) return { redirect: new URL(location) };
      url = location;
      res = await this.request(url);
    }
    throw new Error('too many redirects');
  }
}

const b64url = (buf) => Buffer.from(buf).toString('base64url');
const basic = (id = CLIENT_ID, secret = CLIENT_SECRET) => `Basic ${Buffer.from(`${encodeURIComponent(id)}:${encodeURIComponent(secret)}`).toString('base64')}`;

// ---------------------------------------------------------------------------------------------
// discovery

let discovery;
await check('discovery advertises the five scopes, userinfo, introspection, S256', async () => {
  const res = await fetch(`${issuer}/.well-known/openid-configuration`);
  assert.equal(res.status, 200);
  discovery = await res.json();
  assert.equal(discovery.issuer, issuer);
  for (const s of ['openid', 'profile', 'email', 'organizations', 'roles']) assert.ok(discovery.scopes_supported.includes(s), s);
  assert.ok(!discovery.scopes_supported.includes('offline_access'));
  assert.equal(discovery.userinfo_endpoint, `${issuer}/me`);
  assert.equal(discovery.introspection_endpoint, `${issuer}/token/introspection`);
  assert.deepEqual(discovery.code_challenge_methods_supported, ['S256']);
  assert.deepEqual(discovery.response_types_supported, ['code']);
  assert.deepEqual(discovery.grant_types_supported, ['authorization_code']);
  assert.deepEqual(discovery.token_endpoint_auth_methods_supported, ['client_secret_basic', 'client_secret_post']);
  assert.deepEqual(discovery.id_token_signing_alg_values_supported, ['RS256']);
  for (const c of ['organizations', 'roles', 'email', 'name', 'preferred_username']) assert.ok(discovery.claims_supported.includes(c), c);
});

const jwksNow = async () => (await (await fetch(discovery.jwks_uri)).json()).keys;
const verifyIdToken = (idToken) => jose.jwtVerify(idToken, jose.createLocalJWKSet({ keys: cachedJwks }), {
  issuer, audience: CLIENT_ID, algorithms: ['RS256'],
});
let cachedJwks = await jwksNow();

// ---------------------------------------------------------------------------------------------
// the flow

async function authorize(browser, { scope = 'openid profile email organizations roles', extra = {} } = {}) {
  const state = b64url(randomBytes(16));
  const nonce = b64url(randomBytes(16));
  const verifier = b64url(randomBytes(32));
  const challenge = b64url(createHash('sha256').update(verifier).digest());
  const url = new URL(discovery.authorization_endpoint);
  url.search = new URLSearchParams({
    client_id: CLIENT_ID, response_type: 'code', redirect_uri: REDIRECT_URI, scope, state, nonce,
    code_challenge: challenge, code_challenge_method: 'S256', ...extra,
  });
  const first = await browser.follow(url.href);
  return { state, nonce, verifier, first };
}

async function submitLogin(browser, page, username, password) {
  const html = await page.res.text();
  const action = /<form method="post" action="([^"]+)">/.exec(html)?.[1];
  assert.ok(action, `no login form in:\n${html}`);
  assert.match(html, /<input id="username" name="username"/);
  assert.match(html, /<input id="password" name="password" type="password"/);
  assert.match(html, /<button id="login" type="submit">Sign in<\/button>/);
  const formUrl = new URL(action, page.url).href;
  return browser.follow(formUrl, {
    method: 'POST',
    headers: { 'content-type': 'application/x-www-form-urlencoded' },
    body: new URLSearchParams({ username, password }).toString(),
  });
}

async function login(username, opts = {}) {
  const browser = new Browser();
  const a = await authorize(browser, opts);
  assert.equal(a.first.res?.status, 200, 'the authorization request lands on the login page');
  a.first.url = a.first.res.url || undefined;
  // fetch's res.url is the URL fetched; we need the page's URL for the relative form action
  const page = { res: a.first.res, url: issuer };
  const done = await submitLogin(browser, page, username, PASSWORD);
  assert.ok(done.redirect, `login did not redirect to the client: ${done.res?.status} ${await done.res?.text()}`);
  const params = done.redirect.searchParams;
  assert.equal(params.get('error'), null, `${params.get('error')}: ${params.get('error_description')}`);
  assert.equal(params.get('state'), a.state);
  assert.equal(params.get('iss'), issuer);
  return { ...a, browser, code: params.get('code') };
}

async function token(code, verifier, { post = false } = {}) {
  const body = new URLSearchParams({ grant_type: 'authorization_code', code, redirect_uri: REDIRECT_URI, code_verifier: verifier });
  const headers = { 'content-type': 'application/x-www-form-urlencoded' };
  if (post) { body.set('client_id', CLIENT_ID); body.set('client_secret', CLIENT_SECRET); } else headers.authorization = basic();
  const res = await fetch(discovery.token_endpoint, { method: 'POST', headers, body });
  return { status: res.status, body: await res.json() };
}

async function introspect(accessToken) {
  const res = await fetch(discovery.introspection_endpoint, {
    method: 'POST',
    headers: { 'content-type': 'application/x-www-form-urlencoded', authorization: basic() },
    body: new URLSearchParams({ token: accessToken }),
  });
  assert.equal(res.status, 200);
  return res.json();
}

async function userinfo(accessToken) {
  const res = await fetch(discovery.userinfo_endpoint, { headers: { authorization: `Bearer ${accessToken}` } });
  return { status: res.status, body: res.status === 200 ? await res.json() : await res.text(), www: res.headers.get('www-authenticate') };
}

async function control(path, body) {
  const res = await fetch(`${issuer}${path}`, {
    method: 'POST', headers: { 'content-type': 'application/json' }, body: body === undefined ? undefined : JSON.stringify(body),
  });
  const json = await res.json();
  assert.equal(res.status, 200, JSON.stringify(json));
  return json;
}

const OLIVIA_ORGS = [{ id: 'org-acme', name: 'Acme', roles: ['owner'] }];

let olivia;
let oliviaTokens;
let firstKid;
await check('olivia logs in through the HTML form (code + PKCE + state + nonce), token with client_secret_basic', async () => {
  olivia = await login('olivia');
  const t = await token(olivia.code, olivia.verifier);
  assert.equal(t.status, 200, JSON.stringify(t.body));
  assert.equal(t.body.token_type, 'Bearer');
  assert.equal(t.body.expires_in, 3600);
  assert.equal(t.body.refresh_token, undefined);
  assert.equal(t.body.scope, 'openid profile email organizations roles');
  assert.ok(!t.body.access_token.includes('.'), 'access token is opaque');
  oliviaTokens = t.body;
});

await check('the ID token verifies against the JWKS and carries the claims of the granted scopes', async () => {
  const { payload, protectedHeader } = await verifyIdToken(oliviaTokens.id_token);
  firstKid = protectedHeader.kid;
  assert.ok(firstKid);
  assert.equal(protectedHeader.alg, 'RS256');
  assert.equal(payload.sub, 'persona-olivia');
  assert.equal(payload.nonce, olivia.nonce);
  assert.equal(payload.name, 'Olivia Owner');
  assert.equal(payload.preferred_username, 'olivia');
  assert.equal(payload.email, 'olivia@acme.test');
  assert.equal(payload.email_verified, true);
  assert.deepEqual(payload.organizations, OLIVIA_ORGS);
  assert.deepEqual(payload.roles, ['user']);
  assert.equal(payload.exp - payload.iat, 3600);
  assert.deepEqual(Object.keys(payload).sort(), ['aud', 'email', 'email_verified', 'exp', 'iat', 'iss',
    'name', 'nonce', 'organizations', 'preferred_username', 'roles', 'sub']);
});

await check('scopes not asked for leave their claims out of the ID token and userinfo', async () => {
  const l = await login('ada', { scope: 'openid email' });
  const t = await token(l.code, l.verifier, { post: true }); // client_secret_post works too
  assert.equal(t.status, 200, JSON.stringify(t.body));
  const { payload } = await verifyIdToken(t.body.id_token);
  assert.equal(payload.sub, 'persona-ada');
  assert.equal(payload.email, 'ada@globex.test');
  assert.equal(payload.organizations, undefined);
  assert.equal(payload.roles, undefined);
  assert.equal(payload.name, undefined);
  const u = await userinfo(t.body.access_token);
  assert.deepEqual(u.body, { sub: 'persona-ada', email: 'ada@globex.test', email_verified: true });
  // introspection answers the live organizations and roles regardless of scope
  const i = await introspect(t.body.access_token);
  assert.equal(i.active, true);
  assert.deepEqual(i.organizations, [{ id: 'org-globex', name: 'Globex', roles: ['owner'] }]);
  assert.deepEqual(i.roles, ['admin', 'user']);
});

await check('userinfo answers organizations and roles', async () => {
  const u = await userinfo(oliviaTokens.access_token);
  assert.equal(u.status, 200);
  assert.deepEqual(u.body, {
    sub: 'persona-olivia', name: 'Olivia Owner', preferred_username: 'olivia', email: 'olivia@acme.test',
    email_verified: true, organizations: OLIVIA_ORGS, roles: ['user'],
  });
});

await check('introspection: active, with the live organizations and roles', async () => {
  const i = await introspect(oliviaTokens.access_token);
  assert.equal(i.active, true);
  assert.equal(i.sub, 'persona-olivia');
  assert.equal(i.client_id, CLIENT_ID);
  assert.equal(i.username, 'olivia');
  assert.equal(i.scope, 'openid profile email organizations roles');
  assert.equal(i.token_type, 'Bearer');
  assert.equal(i.iss, issuer);
  assert.deepEqual(i.organizations, OLIVIA_ORGS);
  assert.deepEqual(i.roles, ['user']);
  console.log(`  introspection answer: ${JSON.stringify(i)}`);
  const bad = await introspect('not-a-token');
  assert.deepEqual(bad, { active: false });
});

await check('/test/personas/olivia changes what introspection (and userinfo) answer', async () => {
  const demoted = [{ id: 'org-acme', name: 'Acme', roles: ['member'] }];
  const answer = await control('/test/personas/olivia', { organizations: demoted });
  assert.deepEqual(answer, { username: 'olivia', sub: 'persona-olivia', organizations: demoted, roles: ['user'] });
  const i = await introspect(oliviaTokens.access_token);
  assert.equal(i.active, true);
  assert.deepEqual(i.organizations, demoted);
  assert.deepEqual(i.roles, ['user']);
  assert.deepEqual((await userinfo(oliviaTokens.access_token)).body.organizations, demoted);
  await control('/test/personas/olivia', { roles: ['user', 'auditor'] });
  assert.deepEqual((await introspect(oliviaTokens.access_token)).roles, ['user', 'auditor']);
  await control('/test/personas/olivia', { organizations: OLIVIA_ORGS, roles: ['user'] });
  assert.deepEqual((await introspect(oliviaTokens.access_token)).organizations, OLIVIA_ORGS);
});

let secondKid;
let oliviaAfterRotation;
await check('/test/rotate-keys: new logins are signed with the new key, both keys published, old tokens live', async () => {
  const r = await control('/test/rotate-keys');
  secondKid = r.kid;
  assert.notEqual(secondKid, firstKid);
  assert.deepEqual(r.keys, [secondKid, firstKid]);
  cachedJwks = await jwksNow();
  assert.deepEqual(cachedJwks.map((k) => k.kid), [secondKid, firstKid]);
  for (const k of cachedJwks) {
    assert.equal(k.kty, 'RSA'); assert.equal(k.alg, 'RS256'); assert.equal(k.use, 'sig'); assert.equal(k.d, undefined);
  }
  const l = await login('olivia');
  const t = await token(l.code, l.verifier);
  assert.equal(t.status, 200, JSON.stringify(t.body));
  const { payload, protectedHeader } = await verifyIdToken(t.body.id_token);
  assert.equal(protectedHeader.kid, secondKid);
  assert.equal(payload.nonce, l.nonce);
  await verifyIdToken(oliviaTokens.id_token); // the old one still verifies: its key is still published
  assert.equal((await introspect(oliviaTokens.access_token)).active, true);
  assert.equal((await userinfo(oliviaTokens.access_token)).status, 200);
  oliviaAfterRotation = t.body;
});

await check('a session survives rotation: the same browser gets a code without the form', async () => {
  const a = await authorize(olivia.browser);
  assert.ok(a.first.redirect, `expected a redirect to the client, got ${a.first.res?.status}`);
  assert.ok(a.first.redirect.searchParams.get('code'));
});

await check('/test/revoke/olivia: her access tokens are inactive, userinfo refuses them', async () => {
  const maxLogin = await login('max');
  const maxTokens = (await token(maxLogin.code, maxLogin.verifier)).body;
  const r = await control('/test/revoke/olivia');
  assert.equal(r.username, 'olivia');
  assert.equal(r.sub, 'persona-olivia');
  assert.ok(r.revoked >= 2, JSON.stringify(r));
  assert.deepEqual(await introspect(oliviaTokens.access_token), { active: false });
  assert.deepEqual(await introspect(oliviaAfterRotation.access_token), { active: false });
  const u = await userinfo(oliviaTokens.access_token);
  assert.equal(u.status, 401);
  assert.match(u.www, /invalid_token/);
  // others are untouched
  const i = await introspect(maxTokens.access_token);
  assert.equal(i.active, true);
  assert.deepEqual(i.organizations, [{ id: 'org-acme', name: 'Acme', roles: ['member'] }]);
  // a new login afterwards works again
  const l = await login('olivia');
  const t = await token(l.code, l.verifier);
  assert.equal((await introspect(t.body.access_token)).active, true);
});

async function freshIdToken(username = 'nora') {
  const l = await login(username);
  const t = await token(l.code, l.verifier);
  assert.equal(t.status, 200, JSON.stringify(t.body));
  return { idToken: t.body.id_token, nonce: l.nonce };
}

for (const mode of ['tamper', 'wrong-nonce', 'wrong-issuer', 'wrong-audience', 'expired']) {
  await check(`mischief ${mode} alters exactly the next ID token`, async () => {
    assert.deepEqual(await control('/test/mischief', { idToken: mode }), { idToken: mode });
    const { idToken, nonce } = await freshIdToken();
    const payload = jose.decodeJwt(idToken);
    const header = jose.decodeProtectedHeader(idToken);
    assert.equal(header.kid, secondKid);
    const keys = jose.createLocalJWKSet({ keys: cachedJwks });
    const now = Math.floor(Date.now() / 1000);
    switch (mode) {
      case 'tamper':
        await assert.rejects(jose.compactVerify(idToken, keys), { code: 'ERR_JWS_SIGNATURE_VERIFICATION_FAILED' });
        assert.equal(payload.nonce, nonce);
        break;
      case 'wrong-nonce':
        await verifyIdToken(idToken);
        assert.notEqual(payload.nonce, nonce);
        assert.ok(payload.nonce);
        break;
      case 'wrong-issuer':
        await jose.compactVerify(idToken, keys);
        assert.equal(payload.iss, 'http://wrong-issuer.test');
        await assert.rejects(verifyIdToken(idToken), { code: 'ERR_JWT_CLAIM_VALIDATION_FAILED', claim: 'iss' });
        assert.equal(payload.nonce, nonce);
        break;
      case 'wrong-audience':
        await jose.compactVerify(idToken, keys);
        assert.equal(payload.aud, 'someone-else');
        await assert.rejects(verifyIdToken(idToken), { code: 'ERR_JWT_CLAIM_VALIDATION_FAILED', claim: 'aud' });
        break;
      case 'expired':
        await jose.compactVerify(idToken, keys);
        assert.ok(payload.exp <= now - 590 && payload.exp >= now - 610, `exp ${payload.exp} now ${now}`);
        assert.ok(payload.iat < payload.exp);
        await assert.rejects(verifyIdToken(idToken), { code: 'ERR_JWT_EXPIRED' });
        break;
      default:
    }
    // mischief is spent: the one after is fine
    const next = await freshIdToken();
    const ok = await verifyIdToken(next.idToken);
    assert.equal(ok.payload.nonce, next.nonce);
  });
}

await check('mischief null clears a pending mode; an unknown mode is refused', async () => {
  await control('/test/mischief', { idToken: 'tamper' });
  assert.deepEqual(await control('/test/mischief', { idToken: null }), { idToken: null });
  const { idToken } = await freshIdToken();
  await verifyIdToken(idToken);
  const res = await fetch(`${issuer}/test/mischief`, { method: 'POST', body: JSON.stringify({ idToken: 'nonsense' }) });
  assert.equal(res.status, 400);
});

await check('a reused code is refused invalid_grant (and a wrong verifier too)', async () => {
  const l = await login('max');
  const wrong = await token(l.code, b64url(randomBytes(32)));
  assert.equal(wrong.status, 400);
  assert.equal(wrong.body.error, 'invalid_grant');
  const l2 = await login('max');
  const first = await token(l2.code, l2.verifier);
  assert.equal(first.status, 200);
  assert.equal((await introspect(first.body.access_token)).active, true);
  const again = await token(l2.code, l2.verifier);
  assert.equal(again.status, 400);
  assert.equal(again.body.error, 'invalid_grant');
  // oidc-provider revokes the grant of a code presented twice: the first answer's token dies too
  assert.deepEqual(await introspect(first.body.access_token), { active: false });
});

await check('a wrong client secret is refused invalid_client', async () => {
  const l = await login('max');
  const res = await fetch(discovery.token_endpoint, {
    method: 'POST',
    headers: { 'content-type': 'application/x-www-form-urlencoded', authorization: basic(CLIENT_ID, 'wrong') },
    body: new URLSearchParams({ grant_type: 'authorization_code', code: l.code, redirect_uri: REDIRECT_URI, code_verifier: l.verifier }),
  });
  assert.equal(res.status, 401);
  assert.equal((await res.json()).error, 'invalid_client');
});

await check('PKCE is required: an authorization request without code_challenge is refused', async () => {
  const browser = new Browser();
  const url = new URL(discovery.authorization_endpoint);
  url.search = new URLSearchParams({ client_id: CLIENT_ID, response_type: 'code', redirect_uri: REDIRECT_URI, scope: 'openid', state: 's1' });
  const r = await browser.follow(url.href);
  assert.ok(r.redirect);
  assert.equal(r.redirect.searchParams.get('error'), 'invalid_request');
  assert.match(r.redirect.searchParams.get('error_description'), /PKCE/);
});

await check('offline_access is not issued: no refresh token', async () => {
  const l = await login('nora', { scope: 'openid offline_access', extra: { prompt: 'consent' } });
  const t = await token(l.code, l.verifier);
  assert.equal(t.status, 200, JSON.stringify(t.body));
  assert.equal(t.body.refresh_token, undefined);
  assert.equal(t.body.scope, 'openid');
});

await check('a wrong password re-shows the form with an error', async () => {
  const browser = new Browser();
  const a = await authorize(browser);
  const r = await submitLogin(browser, { res: a.first.res, url: issuer }, 'olivia', 'wrong');
  assert.equal(r.res.status, 401);
  const html = await r.res.text();
  assert.match(html, /<p id="error" role="alert">Invalid username or password.<\/p>/);
  assert.match(html, /<button id="login" type="submit">Sign in<\/button>/);
  // and the same interaction still accepts the right password
  const ok = await submitLogin(browser, { res: new Response(html), url: issuer }, 'olivia', PASSWORD);
  assert.ok(ok.redirect?.searchParams.get('code'));
  const unknown = await submitLogin(browser, { res: (await authorize(browser, { extra: { prompt: 'login' } })).first.res, url: issuer }, 'mallory', PASSWORD);
  assert.equal(unknown.res.status, 401);
});

await check('/test/log lists the endpoints, with the authorization query, client_id and grant_type', async () => {
  const log = await (await fetch(`${issuer}/test/log`)).json();
  const auth = log.filter((e) => e.route === 'authorization');
  assert.ok(auth.length > 5);
  assert.equal(auth[0].path, '/auth');
  assert.equal(auth[0].method, 'GET');
  assert.equal(auth[0].client_id, CLIENT_ID);
  assert.equal(auth[0].query.scope, 'openid profile email organizations roles');
  assert.equal(auth[0].query.code_challenge_method, 'S256');
  assert.equal(auth[0].query.redirect_uri, REDIRECT_URI);
  const tok = log.find((e) => e.route === 'token');
  assert.equal(tok.path, '/token');
  assert.equal(tok.method, 'POST');
  assert.equal(tok.grant_type, 'authorization_code');
  assert.equal(tok.client_id, CLIENT_ID);
  assert.ok(log.some((e) => e.route === 'introspection' && e.client_id === CLIENT_ID));
  assert.ok(log.some((e) => e.route === 'userinfo' && e.path === '/me'));
  assert.ok(log.some((e) => e.route === 'interaction-login' && e.method === 'POST'));
  assert.ok(log.some((e) => e.route === 'discovery'));
  assert.ok(!log.some((e) => e.path.startsWith('/test/')));
});

await check('SIGTERM ends the server cleanly', async () => {
  child.kill('SIGTERM');
  const { code } = await childExit;
  assert.equal(code, 0, stderr);
});

if (process.env.IDP_SMOKE_STDERR) process.stderr.write(stderr);
if (failed) process.exit(1);
console.log(`all ${step} checks passed`);
