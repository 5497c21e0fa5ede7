// console.cjs - the browser half of tests/browser/check_console.c: drives
// Debian's chromium through puppeteer-core (DevTools protocol) against a
// running `sekalictl serve`, and checks in PostgreSQL (psql) what the clicks
// did. Exits 0 when every check held. Screenshots, render times and what
// each hostile input showed go to $ARTIFACTS.
//
// Environment (set by check_console.c): CONSOLE_URL, CONSOLE_TOKEN,
// OPERATOR_TOKEN (an operator's own, whose name is hostile markup), QUEUE,
// BIG_QUEUE, PG (conninfo), ARTIFACTS, CHROMIUM, PAYMENTS, BIG, SCHEDULE.
'use strict';
const puppeteer = require('puppeteer-core');
const { execFileSync } = require('child_process');
const fs = require('fs');
const http = require('http');
const path = require('path');

const E = process.env;
const base = E.CONSOLE_URL, Q = E.QUEUE, BIG = E.BIG_QUEUE;
const payments = Number(E.PAYMENTS);
const out = { timings_ms: {}, hostile: [], refused: [], checks: 0 };

function check(cond, what) {
  if (!cond) throw new Error('FAILED: ' + what);
  out.checks++;
  console.log('ok - ' + what);
}

function psql(sql) {
  return execFileSync('psql', ['-XAtq', '-v', 'ON_ERROR_STOP=1', E.PG, '-c', sql]).toString().trim();
}
const lit = (s) => "'" + s.replace(/'/g, "''") + "'";

// The session cookie of a script's login, sent with every request that
// names no Cookie of its own (reading needs a session); anon: none.
let readCookie = null;

// A plain HTTP request outside the browser: what a script or an attacker sends.
function request(method, p, { body, headers, anon } = {}) {
  return new Promise((resolve, reject) => {
    const u = new URL(p, base);
    const h = Object.assign(body ? { 'Content-Type': 'application/x-www-form-urlencoded' } : {},
                            readCookie && !anon ? { Cookie: readCookie } : {}, headers || {});
    const req = http.request(u, { method, headers: h }, (res) => {
      let data = '';
      res.setEncoding('utf8');
      res.on('data', (c) => { data += c; });
      res.on('end', () => resolve({ status: res.statusCode, headers: res.headers, body: data }));
    });
    req.on('error', reject);
    if (body) req.write(body);
    req.end();
  });
}

async function deadCount(queue) {
  const s = JSON.parse((await request('GET', '/api/status')).body);
  return s.queues.find((q) => q.name === queue).dead;
}
// A scan (dry run, purge, replay) reads letters unacked and hands the rest
// back by closing its channel; the broker requeues them after the answer has
// gone, so a count taken at once can be short for a moment. Wait, bounded,
// for the count a test expects, and return the last one seen: a letter really
// lost (or not purged) never reaches it.
async function deadCountSettled(queue, want, ms = 10000) {
  const until = Date.now() + ms;
  let seen = await deadCount(queue);
  while (seen !== want && Date.now() < until) {
    await new Promise((r) => setTimeout(r, 100));
    seen = await deadCount(queue);
  }
  return seen;
}
async function consumers(queue) {
  const s = JSON.parse((await request('GET', '/api/status')).body);
  return s.queues.find((q) => q.name === queue).consumers;
}
const pauses = (queue) => Number(psql(`SELECT count(*) FROM sekali.queue_pauses WHERE queue = ${lit(queue)}`));
const audits = () => Number(psql(`SELECT count(*) FROM sekali.dlq_audit WHERE queue = ${lit(Q)}`));

async function main() {
  fs.mkdirSync(E.ARTIFACTS, { recursive: true });
  const browser = await puppeteer.launch({
    executablePath: E.CHROMIUM, headless: true,
    // An attacker's name that resolves to the console (DNS rebinding).
    args: ['--no-sandbox', '--disable-gpu', '--disable-dev-shm-usage', '--no-first-run',
           '--host-resolver-rules=MAP rebind.evil.example 127.0.0.1'],
  });
  const page = await browser.newPage();
  await page.setViewport({ width: 1400, height: 900 });
  const dialogs = [], pageErrors = [];
  page.on('dialog', async (d) => { dialogs.push(d.type() + ': ' + d.message()); await d.dismiss(); });
  page.on('pageerror', (e) => pageErrors.push(String(e.message || e)));
  // Any CSP violation (a script or an image a value tried to bring in) is kept.
  await page.evaluateOnNewDocument(() => {
    window.__csp = [];
    document.addEventListener('securitypolicyviolation',
      (e) => window.__csp.push(e.violatedDirective + ' ' + e.blockedURI));
  });

  async function visit(name, p, selector) {
    const t0 = Date.now();
    await page.goto(base + p, { waitUntil: 'domcontentloaded' });
    await page.waitForSelector(selector, { timeout: 180000 });
    const ms = Date.now() - t0;
    out.timings_ms[name] = ms;
    console.log(`# ${name}: ${ms} ms`);
    return ms;
  }
  async function shot(name) {
    await page.screenshot({ path: path.join(E.ARTIFACTS, name + '.png'), fullPage: true });
  }
  // Nothing a value could have turned into markup: our one script, no
  // handler attributes, no images, links only to our own paths.
  async function inert(where) {
    const r = await page.evaluate(() => ({
      scripts: [...document.scripts].map((s) => s.src),
      handlers: [...document.querySelectorAll('*')].filter((e) =>
        [...e.attributes].some((a) => a.name.startsWith('on'))).length,
      images: document.querySelectorAll('img, iframe, object, embed, textarea').length,
      badLinks: [...document.querySelectorAll('a[href]')].map((a) => a.getAttribute('href'))
        .filter((h) => !h.startsWith('/')),
      csp: window.__csp,
    }));
    check(r.scripts.length === 1 && r.scripts[0].endsWith('/assets/app.js'), where + ': only app.js runs');
    check(r.handlers === 0, where + ': no element has an on* attribute');
    check(r.images === 0, where + ': no img/iframe/object/textarea element');
    check(r.badLinks.length === 0, where + ': every link is to a path of the console ' + r.badLinks);
    check(r.csp.length === 0, where + ': no CSP violation ' + r.csp);
    check(dialogs.length === 0, where + ': no dialog fired ' + dialogs);
  }

  // ---- nothing is read without a login, nor from another name -------------
  const anonRead = await request('GET', '/api/status', { anon: true });
  check(anonRead.status === 401, 'a read without a session is refused: ' + anonRead.status);
  const port = new URL(base).port;
  const rebind = await browser.newPage();
  await rebind.goto('http://rebind.evil.example:' + port + '/', { waitUntil: 'domcontentloaded' });
  const rebound = await rebind.evaluate(async () => {
    const r = await fetch('/api/status');
    return r.status;
  });
  await rebind.close();
  check(rebound === 421, 'a page at another name resolved to the console reads nothing: ' + rebound);
  await page.goto(base + '/', { waitUntil: 'domcontentloaded' });
  await page.waitForSelector('#login', { timeout: 60000 });
  check(new URL(page.url()).pathname === '/login', 'a page read without a login goes to /login');
  const first = await request('POST', '/api/login', { body: 'operator=reader&token=' + encodeURIComponent(E.CONSOLE_TOKEN) });
  check(first.status === 200, 'a script logs in to read');
  readCookie = String(first.headers['set-cookie']).split(';')[0];

  // After a login, next= leads only to a path of this console.
  await page.goto(base + '/login?' + new URLSearchParams({ next: '/\\evil.example/x' }),
                  { waitUntil: 'domcontentloaded' });
  await page.waitForSelector('#login');
  await page.type('input[name=operator]', 'carol');
  await page.type('input[name=token]', E.CONSOLE_TOKEN);
  await Promise.all([page.waitForNavigation(), page.click('#login button[type=submit]')]);
  const landed = new URL(page.url());
  check(landed.origin === new URL(base).origin && landed.pathname === '/',
        'next=/\\evil.example/x leads to this console\'s / after a login: ' + page.url());

  // ---- reading, logged in ----------------------------------------------------
  await visit('overview (first)', '/', '#queues tbody tr');
  const rows = await page.$$eval('#queues tbody tr', (t) => t.map((r) => r.dataset.queue));
  check(rows.includes(Q) && rows.includes(BIG), 'the overview lists both queues');
  await inert('overview');

  await visit('dead-letter groups (53 letters)', '/dead?queue=' + encodeURIComponent(Q), '#groups');
  const gtext = await page.$eval('#groups', (t) => t.textContent);
  check(gtext.includes('payment gateway {n} for order {n} (req {id})'),
        'errors differing in figures fall into one fingerprint');
  await inert('groups');

  // The hostile letters, each on its own page.
  const hostile = [
    { key: '<script>alert(1)</script>', error: '<script>alert(2)</script>', body: '<script>alert(3)</script>' },
    { key: '"><img src=x onerror=alert(4)>', error: '\'"><img src=x onerror=alert(5)>', body: '"><svg onload=alert(6)>',
      note: '"><img src=x onerror=alert(7)>' },
    { key: '</textarea><script>alert(8)</script>', error: '</textarea></pre></td>',
      body: '</textarea></pre><script>alert(10)</script>' },
    { key: 'javascript:alert(11)', error: 'see javascript:alert(12)', body: 'javascript:alert(13)',
      note: 'javascript:alert(14)' },
    { key: 'nul-key', error: 'the body and x-note hold NULs',
      body: 'before\u0000<script>alert(\'nul\')</script>\u0000after', note: 'a\u0000b' },
  ];
  for (const h of hostile) {
    await visit('letter ' + JSON.stringify(h.key), '/letter?' + new URLSearchParams({ queue: Q, key: h.key }),
                '#letter-key');
    const got = await page.evaluate(() => ({
      key: document.getElementById('letter-key').textContent,
      error: document.getElementById('letter-error').textContent,
      body: document.getElementById('letter-body').textContent,
      headers: [...document.querySelectorAll('table.headers tr')].map((r) => r.textContent).join('\n'),
    }));
    check(got.key === h.key, 'key kept as text: ' + JSON.stringify(h.key));
    check(got.error === h.error, 'error kept as text: ' + JSON.stringify(h.error));
    check(got.body === h.body, 'body kept as text: ' + JSON.stringify(h.body));
    // A header's NUL is stored as U+FFFD (jsonb holds no NUL: headers_json.c).
    if (h.note) check(got.headers.includes('x-note' + h.note.replace(/\u0000/g, '\ufffd')),
                      'header kept as text: ' + JSON.stringify(h.note));
    await inert('letter ' + JSON.stringify(h.key));
    out.hostile.push({ input: h, shown: got.key === h.key && got.error === h.error && got.body === h.body
      ? 'as text, unchanged; no dialog, no element, no CSP violation' : got });
    if (h.key.startsWith('<script>')) await shot('letter');
  }

  // Invalid UTF-8: every byte that is not UTF-8 shown as U+FFFD.
  await visit('letter with invalid UTF-8', '/letter?' + new URLSearchParams({ queue: Q, key: 'bad-utf8-elsewhere' }),
              '#letter-key');
  const u = await page.evaluate(() => ({
    error: document.getElementById('letter-error').textContent,
    body: document.getElementById('letter-body').textContent,
    headers: [...document.querySelectorAll('table.headers tr')].map((r) => r.textContent).join('\n'),
  }));
  check(u.error === 'bytes \ufffd\ufffd in the error', 'invalid UTF-8 in an error is shown as U+FFFD: ' + JSON.stringify(u.error));
  check(u.body === '\ufffd(\ufffd\ufffd body', 'invalid UTF-8 in a body is shown as U+FFFD: ' + JSON.stringify(u.body));
  const surrogate = u.headers.split('\n').find((h) => h.startsWith('x-note')) || '';
  check(surrogate.endsWith(' surrogate') && !/[\ud800-\udfff]/.test(surrogate),
        'an encoded surrogate in a header is replaced: ' + JSON.stringify(surrogate));
  await inert('invalid UTF-8 letter');
  out.hostile.push({ input: 'error "bytes \\xff\\xfe in the error", body "\\xc3\\x28\\xa0\\xa1 body", header "\\xed\\xa0\\x80 surrogate"',
                     shown: { error: u.error, body: u.body, header: surrogate } });
  await visit('letters page with the hostile ones', '/letters?' + new URLSearchParams({ queue: Q, offset: '40' }), '#letters');
  const rows2 = await page.$$eval('#letters tbody tr', (t) => t.map((r) => [r.cells[1].textContent, r.cells[7].textContent]));
  // A key that is not UTF-8 is no key sekali can record: the letter is
  // kept, malformed and without a key, and says why.
  const bad = rows2.find((r) => r[0] === '(no key)' && /UTF-8/.test(r[1]));
  check(bad !== undefined, 'a letter whose key is not UTF-8 is listed without a key, saying why: ' + JSON.stringify(rows2));
  await inert('letters');
  out.hostile.push({ input: 'key "bad-utf8-\\xff\\xfe-\\xc3\\x28"',
                     shown: 'listed as ' + JSON.stringify(bad && bad[0]) + ', error column: ' + JSON.stringify(bad && bad[1]) +
                            ' (malformed: no key PostgreSQL could hold)' });

  // The 1 MB letter: the page shows the first 64 KiB.
  const mbMs = await visit('letter with a 1 MB body', '/letter?' + new URLSearchParams({ queue: Q, key: 'megabyte' }),
                           '#letter-body');
  const mb = await page.$eval('#letter-body', (p) => ({ len: p.textContent.length, head: p.textContent.slice(0, 28) }));
  check(mb.len === 65536 && mb.head === "<script>alert('mb')</script>", 'a 1 MB body is cut to 64 KiB of text');
  await inert('1 MB letter');
  out.hostile.push({ input: '1 MB body starting with <script>, ending with </pre><script>',
                     shown: `the first 65536 characters as text in ${mbMs} ms; size shown as 1048576 bytes` });

  // ---- refused actions, with nothing changed --------------------------------
  const before = { dead: await deadCount(Q), audits: audits() };
  const purgeAll = 'queue=' + encodeURIComponent(Q) + '&all=1';
  async function refused(what, status, r) {
    check(r.status === status, `${what}: refused with ${status} (got ${r.status} ${r.body.trim()})`);
    out.refused.push({ what, status: r.status, answer: r.body.trim() });
  }
  await refused('purge without a login', 401, await request('POST', '/api/dlq/purge', { body: purgeAll, anon: true }));
  await refused('purge by GET', 405, await request('GET', '/api/dlq/purge?' + purgeAll));
  await refused('replay by GET', 405, await request('GET', '/api/dlq/replay?' + purgeAll));
  await refused('login with a wrong token', 401,
                await request('POST', '/api/login', { body: 'operator=mallory&token=guess' }));
  const login = await request('POST', '/api/login', { body: 'operator=bob&token=' + encodeURIComponent(E.CONSOLE_TOKEN) });
  check(login.status === 200, 'a script can log in with the token');
  const setCookie = String(login.headers['set-cookie']);
  check(/HttpOnly/.test(setCookie) && /SameSite=Strict/.test(setCookie) && /Max-Age=600/.test(setCookie),
        'the session cookie is HttpOnly, SameSite=Strict and short-lived: ' + setCookie);
  const cookie = setCookie.split(';')[0];
  const csrf = JSON.parse(login.body).csrf;
  await refused('purge without a CSRF token', 403, await request('POST', '/api/dlq/purge', { body: purgeAll, headers: { Cookie: cookie } }));
  await refused('purge with a wrong CSRF token', 403, await request('POST', '/api/dlq/purge',
    { body: purgeAll + '&csrf=' + 'f'.repeat(64), headers: { Cookie: cookie } }));
  await refused('purge from another origin (Origin)', 403, await request('POST', '/api/dlq/purge',
    { body: purgeAll + '&csrf=' + csrf, headers: { Cookie: cookie, Origin: 'http://evil.example' } }));
  await refused('purge from another site (Sec-Fetch-Site)', 403, await request('POST', '/api/dlq/purge',
    { body: purgeAll + '&csrf=' + csrf, headers: { Cookie: cookie, 'Sec-Fetch-Site': 'cross-site' } }));
  await refused('purge as JSON instead of a form', 400, await request('POST', '/api/dlq/purge',
    { body: '{"queue":"x"}', headers: { Cookie: cookie, 'Content-Type': 'application/json' } }));
  const logout = await request('POST', '/api/logout', { body: 'csrf=' + csrf, headers: { Cookie: cookie } });
  check(logout.status === 200, 'logout');
  await refused('purge with a stale session (logged out)', 401, await request('POST', '/api/dlq/purge',
    { body: purgeAll + '&csrf=' + csrf, headers: { Cookie: cookie } }));
  await refused('purge with a made-up session', 401, await request('POST', '/api/dlq/purge',
    { body: purgeAll + '&csrf=' + csrf, headers: { Cookie: 'sekali_console=' + 'a'.repeat(64) } }));

  // ---- log in through the form ------------------------------------------------
  await visit('login page', '/login', '#login');
  await shot('login');
  await page.type('input[name=operator]', 'alice');
  await page.type('input[name=token]', E.CONSOLE_TOKEN);
  await Promise.all([page.waitForNavigation(), page.click('#login button[type=submit]')]);
  await page.waitForSelector('#logout');
  check((await page.$eval('#who', (w) => w.textContent)).includes('alice'), 'logged in as alice');
  const cookies = await page.cookies();
  const sc = cookies.find((c) => c.name === 'sekali_console');
  check(sc && sc.httpOnly && sc.sameSite === 'Strict', 'the browser holds an HttpOnly SameSite=Strict cookie');
  check((await page.evaluate(() => document.cookie)) === '', 'no script can read the session cookie');

  // Another origin in the same browser (a data: page): its POST is refused.
  const evil = await browser.newPage();
  evil.on('dialog', async (d) => { dialogs.push('evil ' + d.message()); await d.dismiss(); });
  await evil.goto('data:text/html,<title>evil</title>');
  const evilStatus = await evil.evaluate(async (u, b) => {
    try {
      const r = await fetch(u + '/api/dlq/purge', { method: 'POST', body: new URLSearchParams(b),
                                                    credentials: 'include' });
      return r.status;
    } catch (e) { return 'blocked: ' + e.message; }
  }, base, purgeAll);
  await evil.close();
  check(evilStatus === 403 || String(evilStatus).startsWith('blocked'),
        'a page of another origin cannot purge (' + evilStatus + ')');
  out.refused.push({ what: 'purge from a page of another origin in the logged-in browser', status: evilStatus });
  check(await deadCountSettled(Q, before.dead) === before.dead && audits() === before.audits,
        'after every refused request the dead letters and the audit are as they were');

  // ---- replay a group by clicking ------------------------------------------------
  await visit('dead-letter groups (logged in)', '/dead?queue=' + encodeURIComponent(Q), '#groups button.replay');
  await shot('dead-letters');
  const idx = await page.$$eval('#groups tbody tr', (rows) => rows.findIndex((r) =>
    r.cells[0].textContent === 'failed' && r.cells[1].textContent === 'flaky: failing until released'));
  check(idx >= 0, 'the group of the payment failures is listed');
  const groupRow = (await page.$$('#groups tbody tr'))[idx];
  await (await groupRow.$('button.replay')).click();
  await page.waitForSelector('#confirm');
  check(await page.$eval('#dry-count', (b) => b.textContent) === String(payments),
        `the dry run says ${payments} would be replayed`);
  check(audits() === before.audits && await deadCountSettled(Q, before.dead) === before.dead, 'the dry run changed nothing');
  await shot('replay-dry-run');
  await page.click('#confirm-yes');
  await page.waitForSelector('#result', { timeout: 120000 });
  const result = await page.$eval('#result', (r) => r.textContent);
  check(result.startsWith(`replayed ${payments},`), 'the replay reports ' + result);
  const t0 = Date.now();
  let done = 0;
  while (Date.now() - t0 < 120000) {
    done = Number(psql(`SELECT count(*) FROM sekali.idempotency_keys WHERE queue = ${lit(Q)} AND key LIKE 'pay-%' AND status = 'completed'`));
    if (done === payments) break;
    await new Promise((r) => setTimeout(r, 200));
  }
  check(done === payments, `all ${payments} replayed jobs completed (${done})`);
  out.timings_ms['replay to all completed'] = Date.now() - t0;
  await new Promise((r) => setTimeout(r, 2000));  // a second run would show by now
  const effects = psql(`SELECT count(*) || ' ' || count(DISTINCT idempotency_key) FROM sekali_test.effects WHERE queue = ${lit(Q)} AND idempotency_key LIKE 'pay-%'`);
  check(effects === `${payments} ${payments}`, `each replayed job ran exactly once (effects, keys: ${effects})`);
  check(Number(psql(`SELECT count(*) FROM sekali.dlq_audit WHERE queue = ${lit(Q)} AND action = 'replay' AND actor = 'alice'`)) === payments,
        'the audit names alice for each replay');

  // ---- purge with a dry run ----------------------------------------------------------
  await visit('letters page (logged in)', '/letters?queue=' + encodeURIComponent(Q), '#letters');
  const deadBefore = await deadCount(Q);
  await page.$$eval('input.pick', (boxes) => boxes.forEach((b) => {
    if (b.dataset.key === 'javascript:alert(11)') b.click();
  }));
  await page.click('#purge-selected');
  await page.waitForSelector('#confirm');
  check(await page.$eval('#dry-count', (b) => b.textContent) === '1', 'the purge dry run says 1');
  await page.click('#confirm-no');
  const deadAfterNo = await deadCountSettled(Q, deadBefore);
  check(deadAfterNo === deadBefore, `cancelling after the dry run purges nothing (${deadBefore} -> ${deadAfterNo})`);
  await page.click('#purge-selected');
  await page.waitForSelector('#confirm');
  await page.click('#confirm-yes');
  await page.waitForSelector('#result', { timeout: 60000 });
  check((await page.$eval('#result', (r) => r.textContent)).startsWith('purged 1 of 1'), 'purged 1 of 1');
  const deadAfterPurge = await deadCountSettled(Q, deadBefore - 1);
  check(deadAfterPurge === deadBefore - 1, `one dead letter fewer (${deadBefore} -> ${deadAfterPurge})`);
  check(Number(psql(`SELECT count(*) FROM sekali.dlq_audit WHERE queue = ${lit(Q)} AND action = 'purge' AND actor = 'alice' AND key = 'javascript:alert(11)'`)) === 1,
        'the purge is audited under alice');
  await shot('letters');

  // ---- pause and resume: refused first, with nothing changed --------------------------
  const pauseQ = 'queue=' + encodeURIComponent(Q) + '&reason=nope';
  const consumersBefore = await consumers(Q);
  check(consumersBefore > 0, `${Q} has consumers before any pause (${consumersBefore})`);
  await refused('pause without a login', 401, await request('POST', '/api/pause', { body: pauseQ, anon: true }));
  await refused('pause by GET', 405, await request('GET', '/api/pause?' + pauseQ));
  const login2 = await request('POST', '/api/login', { body: 'operator=bob&token=' + encodeURIComponent(E.CONSOLE_TOKEN) });
  check(login2.status === 200, 'a script logs in again');
  const cookie2 = String(login2.headers['set-cookie']).split(';')[0];
  await refused('pause by GET with a session', 405, await request('GET', '/api/pause?' + pauseQ, { headers: { Cookie: cookie2 } }));
  await refused('pause without a CSRF token', 403, await request('POST', '/api/pause', { body: pauseQ, headers: { Cookie: cookie2 } }));
  await refused('pause with a wrong CSRF token', 403, await request('POST', '/api/pause',
    { body: pauseQ + '&csrf=' + 'e'.repeat(64), headers: { Cookie: cookie2 } }));
  await refused('resume by GET', 405, await request('GET', '/api/resume?queue=' + encodeURIComponent(Q)));
  await refused('pause of a queue not configured', 400, await request('POST', '/api/pause',
    { body: 'queue=not-a-queue&csrf=' + JSON.parse(login2.body).csrf, headers: { Cookie: cookie2 } }));
  check(pauses(Q) === 0 && pauses('not-a-queue') === 0, 'no refused request wrote a pause row');
  check(await consumers(Q) === consumersBefore, 'no refused request took a consumer away');

  // ---- pause by clicking ------------------------------------------------------------------
  await visit('overview (logged in)', '/', '#queues tbody tr button.pause');
  const pauseButton = async (cls) => {
    const rows = await page.$$('#queues tbody tr');
    for (const r of rows)
      if (await r.evaluate((x) => x.dataset.queue) === Q) return r.$('button.' + cls);
    return null;
  };
  await (await pauseButton('pause')).click();
  await page.waitForSelector('#pause-form');
  await page.type('#pause-reason', 'payment provider incident <b>#42</b>');
  await page.click('#pause-yes');
  await page.waitForFunction(() => { const r = document.getElementById('result'); return r && /paused/.test(r.textContent); },
                             { timeout: 60000 });
  const paused = await page.$eval('#result', (r) => r.textContent);
  check(paused === Q + ': paused, no consumer left', 'the pause reports ' + JSON.stringify(paused));
  check(psql(`SELECT paused_by || '|' || reason FROM sekali.queue_pauses WHERE queue = ${lit(Q)}`) ===
        'alice|payment provider incident <b>#42</b>', 'the pause row names alice and the reason, as typed');
  check(await consumers(Q) === 0, 'the broker counts no consumer of the paused queue');
  await page.waitForFunction((q) => { const r = document.querySelector(`#queues tr[data-queue="${q}"] td.state`);
    return r && r.textContent.startsWith('paused by alice'); }, { timeout: 20000 }, Q);
  check(await page.$eval(`#queues tr[data-queue="${Q}"] td.state`, (t) => t.textContent) ===
        'paused by alice: payment provider incident <b>#42</b>', 'the overview shows the pause, its reason as text');
  await inert('overview (paused)');
  await shot('overview-paused');

  // ---- resume by clicking -------------------------------------------------------------------
  await page.waitForSelector(`#queues tr[data-queue="${Q}"] button.resume`, { timeout: 20000 });
  await (await pauseButton('resume')).click();
  await page.waitForFunction(() => { const r = document.getElementById('result'); return r && /resumed/.test(r.textContent); },
                             { timeout: 60000 });
  check(pauses(Q) === 0, 'the resume removed the pause row');
  const r0 = Date.now();
  let back = 0;
  while (Date.now() - r0 < 60000 && (back = await consumers(Q)) < consumersBefore)
    await new Promise((r) => setTimeout(r, 200));
  check(back === consumersBefore, `the consumers are back after the resume (${back} of ${consumersBefore})`);
  out.timings_ms['resume to consumers back'] = Date.now() - r0;

  // ---- schedules ------------------------------------------------------------------------------
  // A row no config has, written by "anyone" into PostgreSQL: shown as text.
  const hs = { name: '<script>alert(15)</script>', spec: '"><img src=x onerror=alert(16)>',
               queue: 'javascript:alert(17)', key: '</td><script>alert(18)</script>' };
  psql(`INSERT INTO sekali.schedules (name, spec, queue, last_tick, last_key) VALUES
        (${lit(hs.name)}, ${lit(hs.spec)}, ${lit(hs.queue)}, now(), ${lit(hs.key)})`);
  const s0 = Date.now();
  while (Date.now() - s0 < 60000 &&
         psql(`SELECT count(*) FROM sekali.schedules WHERE name = ${lit(E.SCHEDULE)} AND last_key IS NOT NULL`) !== '1')
    await new Promise((r) => setTimeout(r, 200));
  await visit('schedules', '/schedules', '#schedules tbody tr');
  const sched = await page.$$eval('#schedules tbody tr', (rows) => rows.map((r) => ({
    name: r.dataset.schedule, cells: [...r.cells].map((c) => c.textContent),
    href: (r.querySelector('td.last-key a') || { getAttribute: () => null }).getAttribute('href') })));
  const mine = sched.find((x) => x.name === E.SCHEDULE);
  check(mine, 'the schedules page lists the configured schedule ' + E.SCHEDULE);
  check(mine.cells[1] === 'every 5s' && mine.cells[2] === BIG, 'its spec and queue: ' + JSON.stringify(mine.cells));
  check(/^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$/.test(mine.cells[3]) && /^\d{4}-.*Z$/.test(mine.cells[4]) &&
        mine.cells[4] > mine.cells[3], 'its last and next tick: ' + mine.cells[3] + ', ' + mine.cells[4]);
  // It ticks every 5 s: compare within one answer, and with what came before.
  const lastKey = mine.cells[5];
  check(lastKey === `schedule:${E.SCHEDULE}:${mine.cells[3]}` && mine.href === '/key?' + new URLSearchParams({ key: lastKey }),
        'its last job\'s key is its last tick\'s, linking to the key page: ' + mine.href);
  check(psql(`SELECT count(*) FROM sekali.idempotency_keys WHERE queue = ${lit(BIG)} AND key = ${lit(lastKey)}`) === '1',
        'that job is in PostgreSQL');
  check(mine.cells[6] !== '-' && mine.cells[6] !== '', 'its last job\'s state: ' + mine.cells[6]);
  const api = JSON.parse((await request('GET', '/api/schedules')).body);
  check(api.schedules.find((x) => x.name === E.SCHEDULE).last_key >= lastKey, '/api/schedules says the same (or a later tick)');
  const evilRow = sched.find((x) => x.name === hs.name);
  check(evilRow && evilRow.cells[0] === hs.name + ' (not in this config)' && evilRow.cells[1] === hs.spec &&
        evilRow.cells[2] === hs.queue && evilRow.cells[5] === hs.key, 'a hostile schedule row is shown as text');
  await inert('schedules');
  out.hostile.push({ input: hs, shown: 'as text on /schedules; no dialog, no element, no CSP violation' });
  psql(`DELETE FROM sekali.schedules WHERE name = ${lit(hs.name)}`);
  await visit('schedules', '/schedules', '#schedules tbody tr');
  await shot('schedules');
  // The schedule may have ticked since lastKey was read: the link followed
  // is the one on this page, and its key is what the timeline must show.
  const lastKeyLink = `#schedules tr[data-schedule="${E.SCHEDULE}"] td.last-key a`;
  const linkedKey = await page.$eval(lastKeyLink, (a) => a.textContent);
  check(linkedKey >= lastKey && linkedKey.startsWith(`schedule:${E.SCHEDULE}:`),
        'the revisited page shows the same or a later tick: ' + linkedKey);
  await Promise.all([page.waitForNavigation(), page.click(lastKeyLink)]);
  await page.waitForSelector('#trace-key', { timeout: 60000 });
  check(await page.$eval('#trace-key', (c) => c.textContent) === linkedKey, 'the link leads to the key\'s timeline');

  // ---- search a key -------------------------------------------------------------------
  await page.goto(base + '/', { waitUntil: 'domcontentloaded' });
  await page.waitForSelector('#queues');
  const k0 = Date.now();
  await page.type('#search input[name=key]', 'pay-7');
  await Promise.all([page.waitForNavigation(), page.keyboard.press('Enter')]);
  await page.waitForSelector('#timeline tbody tr', { timeout: 60000 });
  out.timings_ms['key search pay-7'] = Date.now() - k0;
  check(await page.$eval('#trace-key', (c) => c.textContent) === 'pay-7', 'the key page shows pay-7');
  const events = await page.$$eval('#timeline tbody tr', (r) => r.map((x) => x.textContent));
  check(events.length >= 2, 'pay-7 has a timeline: ' + events.length + ' events');
  await shot('key');
  await visit('key page of a hostile key', '/key?' + new URLSearchParams({ key: '<script>alert(1)</script>' }), '#trace-key');
  check(await page.$eval('#trace-key', (c) => c.textContent) === '<script>alert(1)</script>', 'a hostile key is searched as text');
  await inert('key page');

  // ---- 100,000 dead letters --------------------------------------------------------------
  await visit('groups of 100,000', '/dead?queue=' + encodeURIComponent(BIG), '#groups');
  check((await page.$('#partial')) === null, 'every one of the 100,000 is counted (PostgreSQL groups them)');
  await shot('dead-letters-100k');
  const big = await page.$eval('#summary', (s) => s.textContent);
  check(big.startsWith('100000 dead letters in 4 groups'), 'all 100,000 grouped: ' + big);
  await visit('last page of 100,000 letters', '/letters?' + new URLSearchParams({ queue: BIG, offset: '99950' }), '#letters');
  check((await page.$$('#letters tbody tr')).length === 50, 'the last page holds 50 letters');
  await visit('first page of 100,000 letters', '/letters?' + new URLSearchParams({ queue: BIG }), '#letters');
  const page1 = await page.$$eval('#letters tbody td.key', (c) => c.map((x) => x.textContent));
  const next = await page.$eval('.pager a:last-child', (a) => a.getAttribute('href'));
  check(/[?&]after=[0-9]+/.test(next) && !/offset=/.test(next), 'next goes by the last id, not an offset: ' + next);
  await visit('next page by id', next, '#letters');
  const page2 = await page.$$eval('#letters tbody td.key', (c) => c.map((x) => x.textContent));
  check(page2.length === 50 && !page2.some((k) => page1.includes(k)), 'the next page holds the next 50 letters');
  const ping = Date.now();
  const st = await request('GET', '/api/session');
  out.timings_ms['an API call while idle'] = Date.now() - ping;
  check(st.status === 200, 'the console still answers');

  // ---- jobs scheduled for later, hostile keys included ---------------------------------------
  const laterKeys = ['later-<script>alert(16)</script>', 'later-"><img src=x onerror=alert(17)>'];
  psql(`SELECT sekali.enqueue(${lit(Q)}, 'test', 'ok'::bytea, p_idempotency_key => k, ` +
       `p_run_at => now() + d) FROM (VALUES (${lit(laterKeys[0])}, interval '2 hours'), ` +
       `(${lit(laterKeys[1])}, interval '1 hour')) v(k, d)`);
  await visit('scheduled jobs', '/scheduled?queue=' + encodeURIComponent(Q), '#scheduled tbody tr');
  const laterShown = await page.$$eval('#scheduled tbody td.key', (c) => c.map((x) => x.textContent));
  check(laterShown.length === 2 && laterShown[0] === laterKeys[1] && laterShown[1] === laterKeys[0],
        'the scheduled jobs, soonest first, keys as text: ' + JSON.stringify(laterShown));
  await inert('scheduled jobs');
  await shot('scheduled');
  psql(`DELETE FROM sekali.outbox WHERE queue = ${lit(Q)} AND published_at IS NULL AND run_at > now()`);

  // ---- jobs in flight: read from sekalid's supervisor, since a claim is uncommitted ---------
  await visit('jobs in flight', '/inflight', '#inflight');
  const running = await page.$eval('#summary', (e) => e.textContent);
  check(/job\(s\) running now/.test(running), 'the jobs in flight, from sekalid: ' + running);
  await inert('jobs in flight');
  await shot('inflight');

  // ---- retries waiting in delay queues, and history beyond five minutes --------------------
  await visit('retries waiting', '/retries', '#retries tbody tr');
  const retryRows = await page.$$eval(`#retries tbody tr[data-queue="${Q}"]`, (r) => r.length);
  check(retryRows > 0, 'the queue\'s delay queues are listed: ' + retryRows + ' row(s)');
  await inert('retries waiting');
  await shot('retries');
  // Two hours ago: no minute the janitor writes meanwhile.
  psql(`INSERT INTO sekali.history (queue, minute, completed, retried, dead_lettered, duplicates) ` +
       `VALUES (${lit(Q)}, date_trunc('minute', now()) - interval '2 hours', 7, 3, 2, 1)`);
  await visit('history', '/history?' + new URLSearchParams({ queue: Q, hours: '24' }), '#history tbody tr');
  const old = await page.$$eval('#history tbody tr', (rs) => rs.map((r) => r.cells[1].textContent + '/' +
    r.cells[3].textContent));
  check(old.includes('7/2'), 'the minute two hours ago is in the 24 hours of history: ' + JSON.stringify(old));
  await inert('history');
  await shot('history');
  psql(`DELETE FROM sekali.history WHERE queue = ${lit(Q)} AND minute < now() - interval '1 hour'`);

  // ---- an operator's own token names them; the name stays text ----------------------------
  const opName = '<img src=x onerror=alert(15)>"dora&amp;';
  const ctx = await browser.createBrowserContext();
  const opPage = await ctx.newPage();
  await opPage.setViewport({ width: 1400, height: 900 });
  opPage.on('dialog', async (d) => { dialogs.push('operator ' + d.message()); await d.dismiss(); });
  await opPage.goto(base + '/login', { waitUntil: 'domcontentloaded' });
  await opPage.waitForSelector('#login');
  check(!(await opPage.$eval('input[name=operator]', (i) => i.required)),
        'with console.operators the login form needs no name');
  await opPage.type('input[name=token]', E.OPERATOR_TOKEN);
  await Promise.all([opPage.waitForNavigation(), opPage.click('#login button[type=submit]')]);
  await opPage.waitForSelector('#logout');
  const who = await opPage.$eval('#who b', (b) => b.textContent);
  check(who === opName, 'the operator is named by the token, as text: ' + who);
  const opMarkup = await opPage.evaluate(() => ({
    images: document.querySelectorAll('img').length,
    handlers: [...document.querySelectorAll('*')].filter((e) =>
      [...e.attributes].some((a) => a.name.startsWith('on'))).length }));
  check(opMarkup.images === 0 && opMarkup.handlers === 0, 'the operator\'s name made no element');
  await opPage.waitForSelector(`#queues tr[data-queue="${Q}"] button.pause`, { timeout: 60000 });
  await opPage.screenshot({ path: path.join(E.ARTIFACTS, 'operator.png'), fullPage: true });
  await ctx.close();

  // ---- the overview, once the sampler has seen the replay -----------------------------------
  await new Promise((r) => setTimeout(r, 11000));
  await visit('overview', '/', '#queues tbody tr');
  await shot('overview');
  await inert('overview (after)');
  const limits = await page.$eval(`#queues tr[data-queue="${Q}"]`, (tr) => tr.cells[tr.cells.length - 2].textContent);
  check(/ \/ none$/.test(limits), 'a queue without a job timeout says "none": ' + limits);
  const health = await page.$eval(`#queues tr[data-queue="${Q}"] td.health`, (td) => td.textContent);
  check(health === 'healthy', 'a queue whose replayed jobs completed is healthy: ' + health);
  check(pageErrors.length === 0, 'no script error on any page ' + pageErrors);
  check(dialogs.length === 0, 'no dialog fired on any page');
  await browser.close();
}

main().then(() => {
  fs.writeFileSync(path.join(E.ARTIFACTS, 'results.json'), JSON.stringify(out, null, 2));
  console.log(`# ${out.checks} checks passed`);
  console.log('# timings (ms): ' + JSON.stringify(out.timings_ms));
}, (e) => {
  fs.writeFileSync(path.join(E.ARTIFACTS, 'results.json'), JSON.stringify(out, null, 2));
  console.error(e && e.stack ? e.stack : String(e));
  process.exit(1);
});
