// sekali console: the pages, drawn from the JSON API under /api/.
//
// Every value, and most of all every value that came from a message (keys,
// headers, bodies, errors), enters the page through text nodes: el() below
// never parses markup, and no code here uses innerHTML, insertAdjacentHTML,
// document.write or eval (the Content-Security-Policy's Trusted Types make
// them throw). Links are built from our own paths with encodeURIComponent.
'use strict';

const app = () => document.getElementById('app');
let session = { logged_in: false, actions: false };
let refreshTimer = null;
const overviewAction = document.createElement('div');  // kept across the overview's redraws
overviewAction.id = 'action';

// An element with attributes and children; strings become text nodes.
function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k === 'onclick' || k === 'onsubmit' || k === 'onchange') e.addEventListener(k.slice(2), v);
    else e.setAttribute(k, v === true ? '' : String(v));
  }
  for (const c of children.flat(Infinity)) {
    if (c === null || c === undefined || c === false) continue;
    e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return e;
}

function link(path, params, ...children) {
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(params || {}))
    if (v !== null && v !== undefined && v !== '') q.append(k, v);
  const s = q.toString();
  return el('a', { href: path + (s ? '?' + s : '') }, ...children);
}

const num = (v) => (v === null || v === undefined ? '?' : String(v));
const secs = (v) => (v === null || v === undefined ? '?' : v < 1 ? (v * 1000).toFixed(0) + ' ms'
                                                             : v.toFixed(1) + ' s');
const args = () => new URLSearchParams(location.search);

// Where to go after a login: a path of this console only. The URL parser
// decides, as the browser will when it follows it: "/\evil.example" and
// "//evil.example" are other sites although they start with a slash.
function sameOriginPath(next) {
  if (!next || !next.startsWith('/')) return '/';
  let u;
  try { u = new URL(next, location.origin); } catch (e) { return '/'; }
  return u.origin === location.origin ? u.pathname + u.search + u.hash : '/';
}

function toLogin() {
  location.href = '/login?' + new URLSearchParams({ next: location.pathname + location.search });
}

async function api(path) {
  const r = await fetch(path, { credentials: 'same-origin', headers: { Accept: 'application/json' } });
  const body = await r.json().catch(() => ({ error: 'the answer was not JSON (' + r.status + ')' }));
  if (r.status === 401 && session.actions && location.pathname !== '/login' && path !== '/api/session') {
    toLogin();  // reading needs a session: the login page brings the reader back
    return new Promise(() => {});
  }
  if (!r.ok) throw new Error(body.error || ('HTTP ' + r.status));
  return body;
}

async function post(path, fields) {
  const form = new URLSearchParams();
  for (const [k, v] of Object.entries(fields))
    for (const one of Array.isArray(v) ? v : [v]) form.append(k, one);
  if (session.csrf) form.append('csrf', session.csrf);
  const r = await fetch(path, { method: 'POST', credentials: 'same-origin', body: form,
                                headers: { Accept: 'application/json' } });
  const body = await r.json().catch(() => ({ error: 'the answer was not JSON (' + r.status + ')' }));
  if (!r.ok) throw new Error(body.error || ('HTTP ' + r.status));
  return body;
}

function show(...nodes) {
  const a = app();
  a.replaceChildren(...nodes.flat(Infinity).filter((n) => n !== null && n !== undefined && n !== false));
  document.body.dataset.rendered = String(performance.now());
}

function failure(e) {
  return el('div', { class: 'panel error', role: 'alert' }, String(e && e.message ? e.message : e));
}

async function loadSession() {
  try { session = await api('/api/session'); } catch (e) { session = { logged_in: false }; }
  const who = document.getElementById('who');
  if (session.logged_in)
    who.replaceChildren('operator ', el('b', {}, session.operator), ' ',
      el('button', { id: 'logout', onclick: async () => {
        try { await post('/api/logout', {}); } catch (e) { /* the session is gone either way */ }
        location.href = '/';
      } }, 'Log out'));
  else if (session.actions)
    who.replaceChildren(link('/login', { next: location.pathname + location.search }, 'Log in'));
  else
    who.replaceChildren(el('span', { class: 'muted' }, 'read-only'));
}

// ---- overview ----------------------------------------------------------

function sparkline(points, field, cls) {
  const svgNS = 'http://www.w3.org/2000/svg';
  const svg = document.createElementNS(svgNS, 'svg');
  svg.setAttribute('class', 'spark');
  svg.setAttribute('viewBox', '0 0 160 32');
  svg.setAttribute('preserveAspectRatio', 'none');
  const vals = points.map((p) => (typeof p[field] === 'number' ? p[field] : 0));
  if (vals.length > 1) {
    const max = Math.max(...vals, 0.001);
    const line = document.createElementNS(svgNS, 'polyline');
    line.setAttribute('points', vals.map((v, i) =>
      (i * 160 / (vals.length - 1)).toFixed(1) + ',' + (31 - v * 29 / max).toFixed(1)).join(' '));
    if (cls) line.setAttribute('class', cls);
    svg.append(line);
  }
  const t = document.createElementNS(svgNS, 'title');
  t.textContent = field + ', last ' + (vals.length ? vals[vals.length - 1].toFixed(2) : '?');
  svg.append(t);
  return svg;
}

async function overview() {
  const t0 = performance.now();
  let status, rates;
  try {
    [status, rates] = await Promise.all([api('/api/status'), api('/api/rates')]);
  } catch (e) {
    return show(el('h1', {}, 'Overview'), failure(e));
  }
  const byName = new Map((rates.queues || []).map((q) => [q.name, q]));
  const d = status.sekalid || {};
  const problems = [status.broker_error && 'broker: ' + status.broker_error,
                    status.postgresql_error && 'PostgreSQL: ' + status.postgresql_error,
                    status.postgresql_warning && 'PostgreSQL: ' + status.postgresql_warning]
    .filter(Boolean);
  const rows = (status.queues || []).map((q) => {
    const r = byName.get(q.name) || { points: [] };
    const state = q.paused ? 'paused' + (q.paused.by ? ' by ' + q.paused.by : '') +
                             (q.paused.reason ? ': ' + q.paused.reason : '')
      : q.consumers === null ? '?' : q.consumers > 0 ? 'consuming' : 'no consumer';
    const last = r.points.length ? r.points[r.points.length - 1] : {};
    return el('tr', { 'data-queue': q.name },
      el('td', {}, el('b', {}, link('/history', { queue: q.name }, q.name))),
      health(q, r, rates.window_seconds),
      el('td', { class: 'state' }, state),
      el('td', { class: 'num' }, num(q.workers_up), ' / ', num(q.workers_configured)),
      el('td', { class: 'num' }, num(q.ready)),
      el('td', { class: 'num' }, q.delayed ? link('/retries', {}, num(q.delayed)) : num(q.delayed)),
      el('td', { class: 'num' }, q.dead ? link('/dead', { queue: q.name }, num(q.dead)) : num(q.dead)),
      el('td', { class: 'num' }, num(q.processing), ' / ', num(q.failed)),
      el('td', { class: 'num' }, num(q.outbox_pending), ' · ', secs(q.outbox_lag_seconds)),
      el('td', {}, sparkline(r.points, 'jobs_per_second'), ' ',
         typeof last.jobs_per_second === 'number' ? last.jobs_per_second.toFixed(1) : '?', '/s'),
      el('td', {}, sparkline(r.points, 'duplicates_per_second', 'dup'), ' ',
         typeof last.duplicates_per_second === 'number' ? last.duplicates_per_second.toFixed(2) : '?', '/s'),
      el('td', { class: 'num' }, secs(r.p50_seconds), ' / ', secs(r.p99_seconds)),
      el('td', { class: 'num' }, secs(r.lock_ttl_seconds), ' / ',
         r.job_timeout_seconds === 0 ? 'none' : secs(r.job_timeout_seconds)),
      session.logged_in ? el('td', {}, q.paused
        ? el('button', { class: 'resume', onclick: () => resumeQueue(q.name) }, 'Resume')
        : el('button', { class: 'pause danger', onclick: () => pausePanel(q.name) }, 'Pause…')) : null);
  });
  show(el('h1', {}, 'Overview'),
    el('p', {}, 'sekalid: ', d.running === true ? el('span', { class: 'ok' }, 'running')
                             : d.running === false ? el('span', { class: 'bad' }, 'not running')
                             : el('span', { class: 'warn' }, 'unknown'),
      el('span', { class: 'muted' }, ' · metrics: ', String(rates.metrics),
         ' · charts: the last ', String(rates.window_seconds / 60), ' minutes, sampled every ',
         String(rates.interval_seconds), ' s · refreshes by itself')),
    problems.map((p) => el('div', { class: 'panel error' }, p)),
    overviewAction,
    el('table', { id: 'queues' },
      el('thead', {}, el('tr', {}, ['queue', 'health', 'state', 'workers up', 'ready', 'delayed',
        'dead', 'processing / failed', 'outbox · lag', 'jobs/s', 'duplicates/s', 'p50 / p99',
        'lock TTL / timeout', session.logged_in ? '' : null].filter((h) => h !== null)
        .map((h) => el('th', {}, h)))),
      el('tbody', {}, rows)),
    el('p', { class: 'muted' }, 'Rendered in ', String(Math.round(performance.now() - t0)), ' ms.'));
  clearTimeout(refreshTimer);  /* one chain of refreshes, whoever drew last */
  refreshTimer = setTimeout(refreshOverview, 5000);
}

// The overview redraws itself, but not under an open pause form (it would
// take the reason being typed with it).
function refreshOverview() {
  if (overviewAction.firstChild && overviewAction.querySelector('#pause-form'))
    refreshTimer = setTimeout(refreshOverview, 5000);
  else
    overview();
}

// What sekalictl pause does: the row in PostgreSQL, then wait for the
// queue's consumers to go; the session's operator is recorded as --by.
function pausePanel(queue) {
  clearTimeout(refreshTimer);
  const reason = el('input', { name: 'reason', id: 'pause-reason', maxlength: 200, size: 50,
                               'aria-label': 'reason' });
  overviewAction.replaceChildren(el('form', { class: 'panel confirm', id: 'pause-form', onsubmit: async (ev) => {
    ev.preventDefault();
    overviewAction.replaceChildren(el('div', { class: 'panel confirm' }, 'Pausing ', queue, '… (its workers finish the job in hand)'));
    try {
      const r = await post('/api/pause', { queue, reason: reason.value });
      overviewAction.replaceChildren(el('div', { class: 'panel notice', id: 'result' },
        queue, r.state === 'paused' ? ': paused, no consumer left' : ': paused; ' + r.consumers +
        ' consumer(s) still finishing a job', r.changed ? '' : ' (it was paused already)'));
    } catch (e) { overviewAction.replaceChildren(failure(e)); }
    overview();
  } },
    el('p', {}, 'Pause ', el('b', {}, queue), ' on every host until resumed: its workers finish the job in hand and take no more; its messages wait in RabbitMQ. Recorded as paused by ',
       el('b', {}, session.operator), '.'),
    el('p', {}, el('label', {}, 'Reason ', reason)),
    el('div', { class: 'actions' },
      el('button', { type: 'submit', id: 'pause-yes', class: 'danger' }, 'Pause ' + queue),
      el('button', { type: 'button', id: 'pause-no', onclick: () => { overviewAction.replaceChildren(); overview(); } }, 'Cancel'))));
  reason.focus();
}

async function resumeQueue(queue) {
  clearTimeout(refreshTimer);
  try {
    const r = await post('/api/resume', { queue });
    overviewAction.replaceChildren(el('div', { class: 'panel notice', id: 'result' },
      queue, r.changed ? ': resumed' : ': was not paused'));
  } catch (e) { overviewAction.replaceChildren(failure(e)); }
  overview();
}

// ---- dead letters: groups ----------------------------------------------

// The in-page confirmation of an action: a dry run first, then the act.
function actionPanel(holder, what, fields, after) {
  const verb = what === 'replay' ? 'Replay' : 'Purge';
  holder.replaceChildren(el('div', { class: 'panel confirm' }, 'Dry run…'));
  post('/api/dlq/' + what, Object.assign({ dry_run: '1' }, fields)).then((dry) => {
    const n = what === 'replay' ? dry.summary.replayed : dry.summary.purged;
    const refused = dry.summary.refused || 0;
    holder.replaceChildren(el('div', { class: 'panel confirm', id: 'confirm' },
      el('p', {}, 'Dry run: ', el('b', { id: 'dry-count' }, String(n)), ' dead letter(s) would be ',
         what === 'replay' ? 'replayed' : 'purged', refused ? ', ' + refused + ' refused' : '',
         ', of ', String(dry.summary.selected), ' selected. Recorded as done by ',
         el('b', {}, session.operator), '.'),
      el('div', { class: 'actions' },
        el('button', { id: 'confirm-yes', class: what === 'purge' ? 'danger' : 'primary',
          onclick: async () => {
            holder.replaceChildren(el('div', { class: 'panel confirm' }, verb + '…'));
            try {
              const done = await post('/api/dlq/' + what, fields);
              holder.replaceChildren(el('div', { class: 'panel notice', id: 'result' }, done.summary.text));
              if (after) after(done.summary.text);  /* redrawn, with the outcome on top */
            } catch (e) { holder.replaceChildren(failure(e)); }
          } }, verb + ' ' + n),
        el('button', { id: 'confirm-no', onclick: () => holder.replaceChildren() }, 'Cancel'))));
  }).catch((e) => holder.replaceChildren(failure(e)));
}

function noticeOf(text) {
  return typeof text === 'string' ? el('div', { class: 'panel notice', id: 'result' }, text) : null;
}

async function deadGroups(notice) {
  const queue = args().get('queue') || '';
  const t0 = performance.now();
  show(el('h1', {}, 'Dead letters of ', queue), el('p', { class: 'muted' }, 'Reading…'));
  let g;
  const scan = args().get('scan');
  try { g = await api('/api/dlq/groups?' + new URLSearchParams(scan ? { queue, scan } : { queue })); } catch (e) {
    return show(el('h1', {}, 'Dead letters of ', queue), failure(e));
  }
  const holder = el('div', { id: 'action' }, noticeOf(notice));
  const acting = session.logged_in;
  const rows = (g.groups || []).map((x, i) => el('tr', { 'data-group': String(i) },
    el('td', {}, x.reason),
    el('td', { class: 'mono cut fingerprint' }, x.fingerprint),
    el('td', { class: 'num' }, link('/letters', { queue, reason: x.reason, fingerprint: x.fingerprint },
                                    String(x.count))),
    el('td', { class: 'num' }, String(x.replayable)),
    el('td', {}, x.first_failure || '-'), el('td', {}, x.last_failure || '-'),
    el('td', { class: 'mono cut' }, x.example_key === null ? '-'
      : link('/letter', { queue, key: x.example_key }, x.example_key)),
    el('td', {}, acting ? el('div', { class: 'actions' },
      el('button', { class: 'replay', onclick: () => actionPanel(holder, 'replay',
        { queue, reason: x.reason, fingerprint: x.fingerprint }, deadGroups) }, 'Replay…'),
      el('button', { class: 'purge danger', onclick: () => actionPanel(holder, 'purge',
        { queue, reason: x.reason, fingerprint: x.fingerprint }, deadGroups) }, 'Purge…'))
      : el('span', { class: 'muted' }, 'log in to act'))));
  show(el('h1', {}, 'Dead letters of ', queue),
    el('p', { id: 'summary' }, g.summary.text),
    g.summary.partial ? el('p', { class: 'warn', id: 'partial' }, 'Only part of the queue was read: the groups count the first ',
                            String(g.summary.scanned), ' of ', String(g.summary.depth), ' letters. ',
                            link('/dead', { queue, scan: '100000' }, 'Read up to 100,000')) : null,
    g.other ? el('p', { class: 'warn' }, String(g.other), ' letters fall in further groups, not shown.') : null,
    holder,
    el('table', { id: 'groups' },
      el('thead', {}, el('tr', {}, ['reason', 'error fingerprint', 'letters', 'replayable', 'first failure',
        'last failure', 'for example', ''].map((h) => el('th', {}, h)))),
      el('tbody', {}, rows)),
    el('p', {}, link('/letters', { queue }, 'All letters, page by page')),
    el('p', { class: 'muted' }, 'Rendered in ', String(Math.round(performance.now() - t0)), ' ms.'));
}

// ---- dead letters: a page of letters -----------------------------------

async function letters(notice) {
  const a = args();
  const queue = a.get('queue') || '', reason = a.get('reason'), fingerprint = a.get('fingerprint');
  // Next pages go by the last letter's id (after=), which costs the same
  // at the millionth letter as at the first; an offset skips index entries.
  const after = Number(a.get('after') || 0), offset = after > 0 ? 0 : Number(a.get('offset') || 0);
  const limit = 50;
  const t0 = performance.now();
  const q = after > 0 ? { queue, after: String(after), limit: String(limit) }
    : { queue, offset: String(offset), limit: String(limit) };
  if (reason) q.reason = reason;
  if (fingerprint) q.fingerprint = fingerprint;
  let l;
  try { l = await api('/api/dlq/list?' + new URLSearchParams(q)); } catch (e) {
    return show(el('h1', {}, 'Dead letters of ', queue), failure(e));
  }
  const holder = el('div', { id: 'action' }, noticeOf(notice));
  const boxes = [];
  const rows = (l.dead_letters || []).map((x) => {
    const box = x.key === null ? null : el('input', { type: 'checkbox', class: 'pick', 'data-key': x.key });
    if (box) boxes.push(box);
    return el('tr', {},
      el('td', {}, session.logged_in ? box : null),
      el('td', { class: 'mono cut key' }, x.key === null ? '(no key)'
        : link('/letter', { queue, key: x.key }, x.key)),
      el('td', {}, x.reason), el('td', { class: 'num' }, num(x.attempts)),
      el('td', {}, x.key_status || '-'), el('td', {}, x.last_failure || '-'),
      el('td', { class: 'mono cut' }, x.job_type || '-'),
      el('td', { class: 'cut error-text' }, x.malformed || x.error));
  });
  const picked = () => boxes.filter((b) => b.checked).map((b) => b.dataset.key);
  const pager = el('div', { class: 'pager' },
    after > 0 ? link('/letters', Object.assign({}, q, { after: null, limit: null }), '« first')
      : offset > 0 ? link('/letters', Object.assign({}, q, { offset: String(Math.max(0, offset - limit)), limit: null }), '« previous') : null,
    el('span', {}, l.summary.text),
    l.summary.more ? link('/letters', Object.assign({}, q, { offset: null, after: String(l.summary.next_after), limit: null }), 'next »') : null);
  show(el('h1', {}, 'Dead letters of ', queue),
    reason || fingerprint ? el('p', {}, 'Group: ', el('b', {}, reason || 'any reason'), ' · ',
                                el('code', {}, fingerprint || 'any error')) : null,
    el('p', {}, link('/dead', { queue }, '« groups')),
    session.logged_in ? el('div', { class: 'actions' },
      el('button', { id: 'replay-selected', onclick: () => picked().length &&
        actionPanel(holder, 'replay', { queue, key: picked() }, letters) }, 'Replay selected…'),
      el('button', { id: 'purge-selected', class: 'danger', onclick: () => picked().length &&
        actionPanel(holder, 'purge', { queue, key: picked() }, letters) }, 'Purge selected…')) : null,
    holder, pager,
    el('table', { id: 'letters' },
      el('thead', {}, el('tr', {}, ['', 'key', 'reason', 'attempts', 'key status', 'last failure', 'type',
        'error'].map((h) => el('th', {}, h)))),
      el('tbody', {}, rows)),
    el('p', { class: 'muted' }, 'Rendered in ', String(Math.round(performance.now() - t0)), ' ms.'));
}

// ---- one letter ----------------------------------------------------------

function fieldList(pairs) {
  return el('dl', { class: 'fields' }, pairs.map(([k, v]) => [el('dt', {}, k), el('dd', {}, v)]));
}

async function letter() {
  const a = args();
  const queue = a.get('queue') || '', key = a.get('key') || '';
  const t0 = performance.now();
  let s;
  try { s = await api('/api/dlq/show?' + new URLSearchParams({ queue, key })); } catch (e) {
    return show(el('h1', {}, 'Dead letter'), failure(e));
  }
  const all = s.dead_letters || [];
  if (all.length === 0)
    return show(el('h1', {}, 'Dead letter'), el('p', { id: 'summary' }, s.summary.text),
                el('p', {}, link('/key', { key }, 'Trace this key')));
  const parts = all.map((x) => el('section', { class: 'panel letter' },
    fieldList([['key', el('span', { class: 'mono', id: 'letter-key' }, x.key === null ? '(none)' : x.key)],
      ['job id', x.job_id || '-'], ['job type', x.job_type || '-'],
      ['reason', [x.reason, el('span', { class: 'muted' }, ' (recorded by ', x.recorded_by, ')')]],
      ['from', x.from], ['error', el('span', { id: 'letter-error' }, x.error)],
      ['attempts', num(x.attempts)], ['first failure', x.first_failure || '-'],
      ['last failure', x.last_failure || '-'],
      ['replayable', x.replayable ? 'yes' : 'no' + (x.malformed ? ': ' + x.malformed : '')],
      ['key in PostgreSQL', (x.key_status || '-') + (x.replays ? ', replayed ' + x.replays + ' times' : '')]]),
    el('h2', {}, 'Headers'),
    el('table', { class: 'headers' }, el('tbody', {}, Object.entries(x.headers || {}).map(([k, v]) =>
      el('tr', {}, el('td', { class: 'mono' }, k),
         el('td', { class: 'mono cut' }, typeof v === 'string' ? v : JSON.stringify(v)))))),
    el('h2', {}, 'Body (', String(x.body_size), ' bytes', x.body_size > x.body_preview.length ?
       ', the first ' + x.body_preview.length + ' characters shown' : '', ')'),
    el('pre', { id: 'letter-body' }, x.body_preview)));
  show(el('h1', {}, 'Dead letter in ', queue),
    el('p', {}, link('/dead', { queue }, '« groups'), ' · ', link('/key', { key }, 'the key\'s timeline')),
    parts,
    el('p', { class: 'muted' }, 'Rendered in ', String(Math.round(performance.now() - t0)), ' ms.'));
}

// ---- a key's timeline ------------------------------------------------------

async function keyPage() {
  const key = args().get('key') || '';
  const form = el('form', { method: 'get', action: '/key', class: 'panel' },
    el('input', { name: 'key', value: key, size: 60, maxlength: 512, id: 'key-input',
                  'aria-label': 'idempotency key' }), ' ', el('button', { type: 'submit' }, 'Trace'));
  if (!key) return show(el('h1', {}, 'A key\'s story'), form);
  const t0 = performance.now();
  show(el('h1', {}, 'A key\'s story'), form, el('p', { class: 'muted' }, 'Reading…'));
  let t;
  try { t = await api('/api/trace?' + new URLSearchParams({ key })); } catch (e) {
    return show(el('h1', {}, 'A key\'s story'), form, failure(e));
  }
  const rows = (t.events || []).map((e) => el('tr', {},
    el('td', { class: 'mono' }, e.time || '(unknown)'), el('td', {}, e.queue), el('td', {}, e.source),
    el('td', {}, e.event === 'dead-lettered' && e.queue
      ? link('/letter', { queue: e.queue, key }, e.event) : e.event),
    el('td', { class: 'cut' }, e.detail)));
  show(el('h1', {}, 'A key\'s story'), form,
    el('p', {}, 'Key ', el('code', { id: 'trace-key' }, t.key), ': ', String((t.events || []).length),
       ' events, ', String(t.dead_letters), ' dead letters', t.dead_letters_partial
       ? ' (only the first letters of a long dead-letter queue were read)' : '', '; journal: ', t.journal),
    el('table', { id: 'timeline' },
      el('thead', {}, el('tr', {}, ['time', 'queue', 'source', 'event', 'detail'].map((h) => el('th', {}, h)))),
      el('tbody', {}, rows)),
    el('p', { class: 'muted' }, 'Rendered in ', String(Math.round(performance.now() - t0)), ' ms.'));
}

// ---- schedules -----------------------------------------------------------------

// sekalictl schedules --json. Names, specs, keys and states may come from
// rows anyone wrote into PostgreSQL: text nodes, like every other value.
async function schedulesPage() {
  const t0 = performance.now();
  let s;
  try { s = await api('/api/schedules'); } catch (e) {
    return show(el('h1', {}, 'Schedules'), failure(e));
  }
  const list = s.schedules || [];
  const rows = list.map((x) => el('tr', { 'data-schedule': x.name },
    el('td', {}, el('b', {}, x.name), x.configured ? null : el('span', { class: 'muted' }, ' (not in this config)')),
    el('td', { class: 'mono cut spec' }, x.spec),
    el('td', {}, x.queue),
    el('td', { class: 'mono' }, x.last_tick || (x.configured ? 'not started yet' : '-')),
    el('td', { class: 'mono' }, x.next_tick || '-'),
    el('td', { class: 'mono cut last-key' }, x.last_key === null ? '-' : link('/key', { key: x.last_key }, x.last_key)),
    el('td', { class: 'last-state' }, x.last_state === null ? '-' : x.last_state),
    el('td', { class: 'num' }, num(x.enqueued), ' / ', num(x.dropped))));
  show(el('h1', {}, 'Schedules'),
    el('p', { id: 'summary' }, String(list.length), ' schedule(s), by PostgreSQL\'s clock at ', s.now || '?',
       '; each tick is one job, of key schedule:NAME:TICK.'),
    list.length === 0 ? el('p', { class: 'muted' }, 'None configured (schedules: in the config), none in PostgreSQL.') : null,
    el('table', { id: 'schedules' },
      el('thead', {}, el('tr', {}, ['schedule', 'spec', 'queue', 'last tick', 'next tick', 'last job',
        'its state', 'enqueued / missed'].map((h) => el('th', {}, h)))),
      el('tbody', {}, rows)),
    el('p', { class: 'muted' }, 'Rendered in ', String(Math.round(performance.now() - t0)), ' ms.'));
}

// ---- scheduled jobs --------------------------------------------------------------

// sekalictl scheduled --json: jobs enqueued for a later run_at, waiting in
// the outbox. Keys and job types come from producers: text only.
async function scheduledPage() {
  const t0 = performance.now();
  const queue = args().get('queue') || '';
  let s;
  try { s = await api('/api/scheduled?' + new URLSearchParams(queue ? { queue } : {})); } catch (e) {
    return show(el('h1', {}, 'Scheduled jobs'), failure(e));
  }
  const list = s.scheduled || [];
  const rows = list.map((x) => el('tr', { 'data-id': String(x.id) },
    el('td', { class: 'mono' }, x.run_at),
    el('td', { class: 'num' }, secs(x.in_seconds)),
    el('td', {}, link('/scheduled', { queue: x.queue }, x.queue)),
    el('td', { class: 'mono cut key' }, link('/key', { key: x.key }, x.key)),
    el('td', { class: 'job-type' }, x.job_type)));
  show(el('h1', {}, 'Scheduled jobs', queue ? ' of ' + queue : ''),
    el('p', { id: 'summary' }, String(list.length), list.length === s.limit ? '+' : '',
       ' job(s) waiting in the outbox for a later run_at, soonest first, by PostgreSQL\'s clock at ',
       s.now || '?', '. Retries waiting in delay queues: ', link('/retries', {}, 'Retries'), '.'),
    el('table', { id: 'scheduled' },
      el('thead', {}, el('tr', {}, ['runs at (UTC)', 'in', 'queue', 'key', 'job type']
        .map((h) => el('th', {}, h)))),
      el('tbody', {}, rows)),
    el('p', { class: 'muted' }, 'Rendered in ', String(Math.round(performance.now() - t0)), ' ms.'));
}

// ---- jobs in flight ----------------------------------------------------------------

// sekalictl inflight --json: what each worker runs now and for how long,
// from sekalid's supervisor (an uncommitted claim is not in PostgreSQL).
// Keys and job types come from producers: text only.
async function inflightPage() {
  const t0 = performance.now();
  let s;
  try { s = await api('/api/inflight'); } catch (e) {
    return show(el('h1', {}, 'Jobs in flight'), failure(e));
  }
  const list = s.inflight || [];
  const rows = list.map((x) => el('tr', { 'data-pid': String(x.pid) },
    el('td', { class: 'num age' }, secs(x.age_ms / 1000)),
    el('td', {}, x.queue),
    el('td', { class: 'num' }, String(x.pid)),
    el('td', {}, x.phase),
    el('td', { class: 'num' }, String(x.attempt)),
    el('td', { class: 'mono cut key' }, x.key ? link('/key', { key: x.key }, x.key) : '(being read)'),
    el('td', { class: 'job-type' }, x.job_type),
    el('td', { class: 'mono' }, x.started_at),
    el('td', { class: 'mono cut' }, x.trace_id)));
  show(el('h1', {}, 'Jobs in flight'),
    el('p', { id: 'summary' }, String(list.length), ' job(s) running now, the longest first, as sekalid\'s ',
       'workers report them at ', s.now || '?', '. "handler": the handler runs; "job": sekali\'s own steps ',
       '(claim, lock, commit).'),
    el('table', { id: 'inflight' },
      el('thead', {}, el('tr', {}, ['for', 'queue', 'pid', 'in', 'attempt', 'key', 'job type',
        'since (UTC)', 'trace'].map((h) => el('th', {}, h)))),
      el('tbody', {}, rows)),
    el('p', { class: 'muted' }, 'Rendered in ', String(Math.round(performance.now() - t0)), ' ms.'));
}

// ---- retries waiting in delay queues ------------------------------------------

// /api/retries: per queue, the delay queues that exist and what waits in
// each; a message there comes back to its queue within the bucket's delay.
async function retriesPage() {
  const t0 = performance.now();
  let s;
  try { s = await api('/api/retries'); } catch (e) {
    return show(el('h1', {}, 'Retries waiting'), failure(e));
  }
  const queues = s.queues || [];
  const rows = [];
  for (const q of queues) {
    const buckets = q.buckets || [];
    if (buckets.length === 0)
      rows.push(el('tr', { 'data-queue': q.name }, el('td', {}, q.name),
        el('td', { class: 'muted', colspan: 2 }, q.buckets === null ? 'unknown (broker)' : 'no delay queue')));
    for (const b of buckets)
      rows.push(el('tr', { 'data-queue': q.name, 'data-delay': String(b.delay_ms) },
        el('td', {}, q.name),
        el('td', { class: 'num' }, secs(b.delay_ms / 1000)),
        el('td', { class: 'num waiting' }, num(b.messages))));
  }
  const total = queues.reduce((n, q) => n + (q.delayed || 0), 0);
  show(el('h1', {}, 'Retries waiting'),
    el('p', { id: 'summary' }, num(total), ' message(s) wait in delay queues (retries, and jobs whose ',
       'lock was busy); each comes back to its queue within its delay queue\'s delay. Read from ',
       'the broker at most ', secs((s.cached_ms || 0) / 1000), ' ago.'),
    s.broker_error ? el('p', { class: 'bad' }, 'Broker: ', s.broker_error) : null,
    el('table', { id: 'retries' },
      el('thead', {}, el('tr', {}, ['queue', 'back within', 'waiting'].map((h) => el('th', {}, h)))),
      el('tbody', {}, rows)),
    el('p', { class: 'muted' }, 'Rendered in ', String(Math.round(performance.now() - t0)), ' ms.'));
}

// ---- history beyond five minutes -------------------------------------------------

// /api/history: a queue's outcomes per step of minutes, from sekali.history
// (the janitor's rows), over the last 1 hour, 24 hours or 7 days.
async function historyPage() {
  const t0 = performance.now();
  const queue = args().get('queue') || '';
  const hours = args().get('hours') || '24';
  let s;
  try { s = await api('/api/history?' + new URLSearchParams({ queue, hours })); } catch (e) {
    return show(el('h1', {}, 'History'), failure(e));
  }
  const points = s.points || [];
  const sum = (f) => points.reduce((n, p) => n + p[f], 0);
  const rows = points.slice().reverse().map((p) => el('tr', { 'data-t': p.t },
    el('td', { class: 'mono' }, p.t),
    el('td', { class: 'num completed' }, String(p.completed)),
    el('td', { class: 'num' }, String(p.retried)),
    el('td', { class: 'num dead-lettered' }, String(p.dead_lettered)),
    el('td', { class: 'num' }, String(p.duplicates))));
  const spans = [['1', '1 hour'], ['24', '24 hours'], ['168', '7 days']];
  show(el('h1', {}, 'History of ', s.queue),
    el('p', {}, spans.map(([h, label]) => h === String(s.hours) ? el('b', {}, label, ' ')
                                          : el('span', {}, link('/history', { queue, hours: h }, label), ' '))),
    el('p', { id: 'summary' }, 'Last ', String(s.hours), ' h to ', s.now, ', in steps of ',
       String(s.step_minutes), ' min: ', String(sum('completed')), ' completed, ', String(sum('retried')),
       ' retried, ', String(sum('dead_lettered')), ' dead-lettered, ', String(sum('duplicates')),
       ' duplicates. Written by sekalid\'s janitor each round (janitor.interval); steps without a job are left out.'),
    el('p', {}, 'completed ', sparkline(points, 'completed'), ' dead-lettered ',
       sparkline(points, 'dead_lettered', 'dup')),
    el('table', { id: 'history' },
      el('thead', {}, el('tr', {}, ['from (UTC)', 'completed', 'retried', 'dead-lettered', 'duplicates']
        .map((h) => el('th', {}, h)))),
      el('tbody', {}, rows)),
    el('p', { class: 'muted' }, 'Rendered in ', String(Math.round(performance.now() - t0)), ' ms.'));
}

// A queue's health: its consumers (status), and whether its jobs succeed:
// consumers that fail every job are not healthy (rates' window totals).
function health(q, r, window) {
  const failing = r.failed_in_window > 0 && r.completed_in_window === 0;
  if (q.healthy && !failing) return el('td', { class: 'ok health' }, 'healthy');
  const why = failing ? 'failing: ' + r.failed_in_window + ' failed, none completed in ' +
                        Math.round((window || 300) / 60) + ' min' : '';
  return el('td', { class: 'bad health' }, [q.problem, why].filter(Boolean).join('; ') ||
            (q.healthy ? why : 'unknown'));
}

// ---- login -------------------------------------------------------------------

function loginPage() {
  const msg = el('div', { id: 'login-message' });
  // With console.operators a token names its operator; the name field is
  // then only for the shared token of console.token_file, if one is kept.
  const named = session.named_tokens === true;
  const form = el('form', { class: 'panel', id: 'login', onsubmit: async (ev) => {
    ev.preventDefault();
    try {
      const fields = { token: form.elements.token.value };
      if (form.elements.operator.value !== '') fields.operator = form.elements.operator.value;
      session = await post('/api/login', fields);
      location.href = sameOriginPath(args().get('next'));
    } catch (e) { msg.replaceChildren(failure(e)); }
  } },
    el('p', {}, named
      ? 'Reading and acting (replay, purge, pause, resume) need your token (console.operators): it names you in the audit.'
      : 'Reading and acting (replay, purge, pause, resume) need the token of console.token_file and your name, which the audit records.'),
    el('p', {}, el('label', {}, named ? 'Your name (only with the shared token) ' : 'Your name ',
                   el('input', { name: 'operator', required: !named, maxlength: 64, autocomplete: 'username' }))),
    el('p', {}, el('label', {}, 'Token ', el('input', { name: 'token', type: 'password', required: true,
                                                       autocomplete: 'current-password' }))),
    el('button', { type: 'submit', class: 'primary' }, 'Log in'));
  show(el('h1', {}, 'Log in'), msg, form);
}

// ---- routing -------------------------------------------------------------------

const routes = { '/': overview, '/dead': deadGroups, '/letters': letters, '/letter': letter,
                 '/key': keyPage, '/login': loginPage, '/schedules': schedulesPage,
                 '/scheduled': scheduledPage, '/inflight': inflightPage,
                 '/retries': retriesPage, '/history': historyPage };

document.addEventListener('DOMContentLoaded', async () => {
  await loadSession();
  const page = routes[location.pathname] || overview;
  try { await page(); } catch (e) { show(failure(e)); }
});
