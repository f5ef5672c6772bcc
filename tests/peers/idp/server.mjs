// A development OpenID Connect identity provider for Capstan's tests, built on the certified
// `oidc-provider` (panva). All state lives in memory; see docs/idp-peer.md for the contract.
//
//   node server.mjs --port P --client-id ID --client-secret S --redirect-uri URI [--redirect-uri URI ...]
//                   [--host 127.0.0.1] [--issuer URL]
//
// Prints `idp listening on <issuer>` once it serves; ends on SIGTERM/SIGINT.

import { randomBytes } from 'node:crypto';
import * as http from 'node:http';
import { parseArgs } from 'node:util';

import * as jose from 'jose';
import Provider from 'oidc-provider';

// ---------------------------------------------------------------------------------------------
// arguments

function usage(message) {
  process.stderr.write(`${message}\nusage: node server.mjs --port P --client-id ID --client-secret S `
    + '--redirect-uri URI [--redirect-uri URI ...] [--host 127.0.0.1] [--issuer URL]\n');
  process.exit(2);
}

let args;
try {
  ({ values: args } = parseArgs({
    options: {
      port: { type: 'string' },
      host: { type: 'string', default: '127.0.0.1' },
      issuer: { type: 'string' },
      'client-id': { type: 'string' },
      'client-secret': { type: 'string' },
      'redirect-uri': { type: 'string', multiple: true },
    },
    strict: true,
  }));
} catch (err) {
  usage(err.message);
}
if (args.port === undefined || !/^\d+$/.test(args.port) || Number(args.port) > 65535) usage('--port P is required (0..65535)');
if (!args['client-id']) usage('--client-id is required');
if (!args['client-secret']) usage('--client-secret is required');
if (!args['redirect-uri']?.length) usage('at least one --redirect-uri is required');
if (args.issuer !== undefined) {
  let u;
  try { u = new URL(args.issuer); } catch { usage('--issuer must be a URL'); }
  if (!/^https?:$/.test(u.protocol) || u.pathname !== '/' || args.issuer.endsWith('/') || u.search || u.hash) {
    usage('--issuer must be http(s)://host[:port], without a path or a trailing slash');
  }
}

const CLIENT_ID = args['client-id'];
const CLIENT_SECRET = args['client-secret'];
const REDIRECT_URIS = args['redirect-uri'];

// ---------------------------------------------------------------------------------------------
// personas (live: the test controls change them)

const PASSWORD = 'correct horse battery staple';

const personas = new Map(Object.entries({
  olivia: {
    sub: 'persona-olivia', name: 'Olivia Owner', email: 'olivia@acme.test',
    organizations: [{ id: 'org-acme', name: 'Acme', roles: ['owner'] }], roles: ['user'],
  },
  max: {
    sub: 'persona-max', name: 'Max Member', email: 'max@acme.test',
    organizations: [{ id: 'org-acme', name: 'Acme', roles: ['member'] }], roles: ['user'],
  },
  nora: {
    sub: 'persona-nora', name: 'Nora Nobody', email: 'nora@example.test',
    organizations: [], roles: ['user'],
  },
  ada: {
    sub: 'persona-ada', name: 'Ada Admin', email: 'ada@globex.test',
    organizations: [{ id: 'org-globex', name: 'Globex', roles: ['owner'] }], roles: ['admin', 'user'],
  },
}));

function personaBySub(sub) {
  for (const [username, p] of personas) if (p.sub === sub) return { username, ...p };
  return undefined;
}

const clone = (v) => JSON.parse(JSON.stringify(v));

function claimsOf(username, p) {
  return {
    sub: p.sub,
    name: p.name,
    preferred_username: username,
    email: p.email,
    email_verified: true,
    organizations: clone(p.organizations),
    roles: clone(p.roles),
  };
}

// ---------------------------------------------------------------------------------------------
// storage shared by every Provider instance (survives key rotation)

const store = new Map(); // `${model}:${id}` -> { payload, expiresAt }

function storeGet(key) {
  const entry = store.get(key);
  if (!entry) return undefined;
  if (entry.expiresAt !== undefined && entry.expiresAt <= Date.now()) {
    store.delete(key);
    return undefined;
  }
  return entry.payload;
}

class MemoryAdapter {
  constructor(model) { this.model = model; }

  key(id) { return `${this.model}:${id}`; }

  async upsert(id, payload, expiresIn) {
    const expiresAt = typeof expiresIn === 'number' ? Date.now() + expiresIn * 1000 : undefined;
    store.set(this.key(id), { payload, expiresAt });
    if (this.model === 'Session' && payload.uid) store.set(`sessionUid:${payload.uid}`, { payload: id, expiresAt });
    if (payload.userCode) store.set(`userCode:${payload.userCode}`, { payload: id, expiresAt });
  }

  async find(id) { return storeGet(this.key(id)); }

  async findByUid(uid) {
    const id = storeGet(`sessionUid:${uid}`);
    return id === undefined ? undefined : this.find(id);
  }

  async findByUserCode(userCode) {
    const id = storeGet(`userCode:${userCode}`);
    return id === undefined ? undefined : this.find(id);
  }

  async consume(id) {
    const payload = storeGet(this.key(id));
    if (payload) payload.consumed = Math.floor(Date.now() / 1000);
  }

  async destroy(id) { store.delete(this.key(id)); }

  async revokeByGrantId(grantId) {
    for (const [key, entry] of store) {
      if (entry.payload && typeof entry.payload === 'object' && entry.payload.grantId === grantId) store.delete(key);
    }
  }
}

// revoke every access token of an account (and codes not yet redeemed, so none can mint new ones)
function revokeAccount(sub) {
  let count = 0;
  for (const [key, entry] of store) {
    const model = key.slice(0, key.indexOf(':'));
    if ((model === 'AccessToken' || model === 'AuthorizationCode') && entry.payload?.accountId === sub) {
      store.delete(key);
      if (model === 'AccessToken') count += 1;
    }
  }
  return count;
}

// ---------------------------------------------------------------------------------------------
// signing keys

const signingKeys = []; // private JWKs, newest first

async function newSigningKey() {
  const { privateKey } = await jose.generateKeyPair('RS256', { modulusLength: 2048, extractable: true });
  const jwk = await jose.exportJWK(privateKey);
  const kid = await jose.calculateJwkThumbprint(jwk);
  return { ...jwk, kid, alg: 'RS256', use: 'sig' };
}

// ---------------------------------------------------------------------------------------------
// test state

const requestLog = [];
let mischief = null;
const MISCHIEF_MODES = new Set(['tamper', 'wrong-nonce', 'wrong-issuer', 'wrong-audience', 'expired']);
const cookieKeys = [randomBytes(32).toString('base64url')];

async function applyMischief(mode, idToken) {
  const [h, p, s] = idToken.split('.');
  if (mode === 'tamper') {
    const alphabet = 'ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_';
    const i = 10; // well inside the signature, away from the final (partly padding) character
    const replacement = alphabet[(alphabet.indexOf(s[i]) + 1) % alphabet.length];
    return `${h}.${p}.${s.slice(0, i)}${replacement}${s.slice(i + 1)}`;
  }
  const header = jose.decodeProtectedHeader(idToken);
  const payload = jose.decodeJwt(idToken);
  const now = Math.floor(Date.now() / 1000);
  switch (mode) {
    case 'wrong-nonce': payload.nonce = randomBytes(16).toString('base64url'); break;
    case 'wrong-issuer': payload.iss = 'http://wrong-issuer.test'; break;
    case 'wrong-audience': payload.aud = 'someone-else'; break;
    case 'expired': payload.exp = now - 600; payload.iat = payload.exp - 3600; break;
    default: throw new Error(`unknown mischief ${mode}`);
  }
  const current = signingKeys[0];
  const key = await jose.importJWK(current, 'RS256');
  return new jose.CompactSign(new TextEncoder().encode(JSON.stringify(payload)))
    .setProtectedHeader({ ...header, alg: 'RS256', kid: current.kid })
    .sign(key);
}

// ---------------------------------------------------------------------------------------------
// the provider (rebuilt on key rotation, over the same storage and cookie keys)

function html(title, body) {
  return `<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>${title}</title></head>
<body><main>
${body}
</main></body></html>
`;
}

const escapeHtml = (s) => String(s).replace(/[&<>"']/g, (c) => ({
  '&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;', "'": '&#39;',
}[c]));

function buildProvider(issuer) {
  const provider = new Provider(issuer, {
    adapter: MemoryAdapter,
    clients: [{
      client_id: CLIENT_ID,
      client_secret: CLIENT_SECRET,
      redirect_uris: REDIRECT_URIS,
      grant_types: ['authorization_code'],
      response_types: ['code'],
      token_endpoint_auth_method: 'client_secret_basic',
      id_token_signed_response_alg: 'RS256',
    }],
    clientAuthMethods: ['client_secret_basic', 'client_secret_post'],
    jwks: { keys: signingKeys.map((k) => ({ ...k })) },
    cookies: {
      keys: cookieKeys,
      names: { session: 'idp_session', interaction: 'idp_interaction', resume: 'idp_interaction_resume' },
    },
    responseTypes: ['code'],
    scopes: ['openid', 'profile', 'email', 'organizations', 'roles'],
    claims: {
      openid: ['sub'],
      profile: ['name', 'preferred_username'],
      email: ['email', 'email_verified'],
      organizations: ['organizations'],
      roles: ['roles'],
    },
    conformIdTokenClaims: false,
    pkce: { required: () => true },
    features: {
      devInteractions: { enabled: false },
      introspection: { enabled: true, allowedPolicy: async () => true },
      userinfo: { enabled: true },
      revocation: { enabled: false },
    },
    interactions: { url: async (ctx, interaction) => `/interaction/${interaction.uid}` },
    ttl: {
      AccessToken: 3600,
      IdToken: 3600,
      AuthorizationCode: 60,
      Interaction: 3600,
      Session: 8 * 3600,
      Grant: 8 * 3600,
    },
    async findAccount(ctx, sub) {
      const p = personaBySub(sub);
      if (!p) return undefined;
      return {
        accountId: sub,
        // read at the time the claims are asked for: ID token issuance, userinfo
        async claims() {
          const live = personaBySub(sub);
          return claimsOf(live.username, live);
        },
      };
    },
    // consent is granted for the one client automatically: every OIDC scope and claim requested
    async loadExistingGrant(ctx) {
      const { client, session } = ctx.oidc;
      const grantId = ctx.oidc.result?.consent?.grantId || session.grantIdFor(client.clientId);
      let grant = grantId ? await ctx.oidc.provider.Grant.find(grantId) : undefined;
      if (!grant || grant.accountId !== session.accountId) {
        grant = new ctx.oidc.provider.Grant({ clientId: client.clientId, accountId: session.accountId });
      }
      const scopes = [...ctx.oidc.requestParamOIDCScopes];
      if (scopes.length) grant.addOIDCScope(scopes.join(' '));
      const claims = [...ctx.oidc.requestParamClaims];
      if (claims.length) grant.addOIDCClaims(claims);
      await grant.save();
      return grant;
    },
    async renderError(ctx, out) {
      ctx.type = 'html';
      ctx.body = html('Error', `<h1>Error</h1>\n<p id="error">${escapeHtml(out.error)}: ${escapeHtml(out.error_description ?? '')}</p>`);
    },
  });

  // the request log, the live claims of introspection and the ID token mischief
  provider.use(async (ctx, next) => {
    const entry = { method: ctx.method, path: ctx.path };
    requestLog.push(entry);
    try {
      await next();
    } finally {
      const { oidc } = ctx;
      if (oidc?.route) entry.route = oidc.route;
      const clientId = oidc?.client?.clientId ?? oidc?.params?.client_id;
      if (clientId) entry.client_id = clientId;
      if (oidc?.params?.grant_type) entry.grant_type = oidc.params.grant_type;
      if (oidc?.route === 'authorization') {
        entry.query = ctx.method === 'POST' && oidc.body ? { ...oidc.body } : { ...ctx.query };
      }
      entry.status = ctx.status;
    }

    if (ctx.oidc?.route === 'introspection' && ctx.body?.active === true && ctx.body.sub) {
      const p = personaBySub(ctx.body.sub);
      if (p) {
        ctx.body.username = p.username;
        ctx.body.organizations = clone(p.organizations);
        ctx.body.roles = clone(p.roles);
      }
    }

    if (ctx.oidc?.route === 'token' && ctx.status === 200 && typeof ctx.body?.id_token === 'string' && mischief) {
      const mode = mischief;
      mischief = null;
      ctx.body.id_token = await applyMischief(mode, ctx.body.id_token);
      process.stderr.write(`idp: mischief ${mode} applied to an id_token\n`);
    }
  });

  provider.on('server_error', (ctx, err) => process.stderr.write(`idp: server_error ${err.stack ?? err}\n`));

  return provider;
}

// ---------------------------------------------------------------------------------------------
// HTTP: interaction pages, test controls, the provider

let provider;
let providerHandler;

function send(res, status, type, body, headers = {}) {
  res.writeHead(status, { 'Content-Type': type, 'Cache-Control': 'no-store', ...headers });
  res.end(body);
}
const sendJson = (res, status, value) => send(res, status, 'application/json', `${JSON.stringify(value)}\n`);
const sendHtml = (res, status, body) => send(res, status, 'text/html; charset=utf-8', body);

async function readBody(req) {
  const chunks = [];
  let size = 0;
  for await (const chunk of req) {
    size += chunk.length;
    if (size > 1 << 20) throw new Error('body too large');
    chunks.push(chunk);
  }
  return Buffer.concat(chunks).toString('utf8');
}

function loginPage(uid, { error, username } = {}) {
  return html('Sign in', `<h1>Sign in to the test identity provider</h1>
${error ? `<p id="error" role="alert">${escapeHtml(error)}</p>\n` : ''}<form method="post" action="/interaction/${escapeHtml(uid)}/login">
  <label for="username">Username</label>
  <input id="username" name="username" type="text" autocomplete="username" value="${escapeHtml(username ?? '')}" required>
  <label for="password">Password</label>
  <input id="password" name="password" type="password" autocomplete="current-password" required>
  <button id="login" type="submit">Sign in</button>
</form>`);
}

async function interactionOrError(req, res, uid) {
  try {
    const details = await provider.interactionDetails(req, res);
    if (details.uid !== uid) throw new Error('interaction cookie does not match the page');
    return details;
  } catch (err) {
    sendHtml(res, 400, html('Error', `<h1>Error</h1>\n<p id="error">interaction not found: ${escapeHtml(err.error_description ?? err.message)}</p>`));
    return undefined;
  }
}

async function grantAll(details) {
  const { prompt: { details: missing }, params, session } = details;
  const grant = details.grantId
    ? await provider.Grant.find(details.grantId)
    : new provider.Grant({ accountId: session.accountId, clientId: params.client_id });
  if (missing.missingOIDCScope) grant.addOIDCScope(missing.missingOIDCScope.join(' '));
  if (missing.missingOIDCClaims) grant.addOIDCClaims(missing.missingOIDCClaims);
  if (missing.missingResourceScopes) {
    for (const [indicator, scopes] of Object.entries(missing.missingResourceScopes)) {
      grant.addResourceScope(indicator, scopes.join(' '));
    }
  }
  return grant.save();
}

async function handleInteraction(req, res, uid, action) {
  const details = await interactionOrError(req, res, uid);
  if (!details) return;

  if (details.prompt.name === 'consent') {
    // never shown: consent is automatic for the one client
    const grantId = await grantAll(details);
    await provider.interactionFinished(req, res, { consent: { grantId } }, { mergeWithLastSubmission: true });
    return;
  }

  if (action === undefined && req.method === 'GET') {
    sendHtml(res, 200, loginPage(uid));
    return;
  }
  if (action === 'login' && req.method === 'POST') {
    const form = new URLSearchParams(await readBody(req));
    const username = form.get('username') ?? '';
    const persona = personas.get(username);
    if (!persona || form.get('password') !== PASSWORD) {
      sendHtml(res, 401, loginPage(uid, { error: 'Invalid username or password.', username }));
      return;
    }
    await provider.interactionFinished(req, res, {
      login: { accountId: persona.sub, amr: ['pwd'] },
    }, { mergeWithLastSubmission: false });
    return;
  }
  sendHtml(res, 405, html('Error', '<h1>Error</h1>\n<p id="error">method not allowed</p>'));
}

function isLoopback(req) {
  const a = req.socket.remoteAddress ?? '';
  return a === '::1' || a.startsWith('127.') || a.startsWith('::ffff:127.');
}

async function jsonBody(req) {
  const text = await readBody(req);
  if (!text.trim()) return {};
  const value = JSON.parse(text);
  if (value === null || typeof value !== 'object' || Array.isArray(value)) throw new Error('body must be a JSON object');
  return value;
}

async function handleTest(req, res, path) {
  if (!isLoopback(req)) return sendJson(res, 403, { error: 'loopback-only' });

  if (path === '/test/log' && req.method === 'GET') return sendJson(res, 200, requestLog);

  if (req.method !== 'POST') return sendJson(res, 405, { error: 'method-not-allowed' });

  let body;
  try {
    body = await jsonBody(req);
  } catch (err) {
    return sendJson(res, 400, { error: 'invalid-json', message: err.message });
  }

  if (path === '/test/rotate-keys') {
    const key = await newSigningKey();
    signingKeys.unshift(key);
    const next = buildProvider(provider.issuer);
    provider = next;
    providerHandler = next.callback();
    return sendJson(res, 200, { kid: key.kid, keys: signingKeys.map((k) => k.kid) });
  }

  let m = /^\/test\/personas\/([^/]+)$/.exec(path);
  if (m) {
    const username = decodeURIComponent(m[1]);
    const p = personas.get(username);
    if (!p) return sendJson(res, 404, { error: 'unknown-persona', username });
    if (body.organizations !== undefined) {
      if (!Array.isArray(body.organizations)) return sendJson(res, 400, { error: 'organizations-must-be-an-array' });
      p.organizations = clone(body.organizations);
    }
    if (body.roles !== undefined) {
      if (!Array.isArray(body.roles)) return sendJson(res, 400, { error: 'roles-must-be-an-array' });
      p.roles = clone(body.roles);
    }
    return sendJson(res, 200, { username, sub: p.sub, organizations: p.organizations, roles: p.roles });
  }

  m = /^\/test\/revoke\/([^/]+)$/.exec(path);
  if (m) {
    const username = decodeURIComponent(m[1]);
    const p = personas.get(username);
    if (!p) return sendJson(res, 404, { error: 'unknown-persona', username });
    return sendJson(res, 200, { username, sub: p.sub, revoked: revokeAccount(p.sub) });
  }

  if (path === '/test/mischief') {
    const mode = body.idToken ?? null;
    if (mode !== null && !MISCHIEF_MODES.has(mode)) {
      return sendJson(res, 400, { error: 'unknown-mischief', modes: [...MISCHIEF_MODES] });
    }
    mischief = mode;
    return sendJson(res, 200, { idToken: mischief });
  }

  return sendJson(res, 404, { error: 'not-found' });
}

async function handle(req, res) {
  const url = new URL(req.url, 'http://idp.invalid');
  const path = url.pathname;

  if (path.startsWith('/test/')) return handleTest(req, res, path);

  const m = /^\/interaction\/([^/]+)(?:\/(login))?$/.exec(path);
  if (m) {
    const entry = { method: req.method, path, route: m[2] ? 'interaction-login' : 'interaction' };
    requestLog.push(entry);
    await handleInteraction(req, res, m[1], m[2]);
    entry.status = res.statusCode;
    return undefined;
  }

  return providerHandler(req, res);
}

// ---------------------------------------------------------------------------------------------
// start

signingKeys.push(await newSigningKey());

const server = http.createServer((req, res) => {
  handle(req, res).catch((err) => {
    process.stderr.write(`idp: ${req.method} ${req.url}: ${err.stack ?? err}\n`);
    if (!res.headersSent) sendJson(res, 500, { error: 'internal', message: String(err.message ?? err) });
    else res.destroy();
  });
});

await new Promise((resolve, reject) => {
  server.once('error', reject);
  server.listen(Number(args.port), args.host, resolve);
});

const { port } = server.address();
const hostPart = args.host.includes(':') ? `[${args.host}]` : args.host;
const issuer = args.issuer ?? `http://${hostPart}:${port}`;

provider = buildProvider(issuer);
providerHandler = provider.callback();

function stop(signal) {
  process.stderr.write(`idp: ${signal}, stopping\n`);
  server.close(() => process.exit(0));
  server.closeAllConnections();
  setTimeout(() => process.exit(0), 2000).unref();
}
process.on('SIGTERM', () => stop('SIGTERM'));
process.on('SIGINT', () => stop('SIGINT'));

process.stdout.write(`idp listening on ${issuer}\n`);
