// DOM helpers: elements are built with textContent only (never innerHTML), so
// nothing the api returns can inject markup or script.

/**
 * `h('a', {href: '#/x', class: 'y'}, 'text', child)`: an element. Attributes
 * starting with `on` are event listeners; `false`/`null`/`undefined` ones are
 * skipped; children may be strings, nodes, arrays or null.
 */
export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === false || v === null || v === undefined) continue;
    if (k.startsWith('on') && typeof v === 'function') el.addEventListener(k.slice(2), v);
    else if (k === 'class') el.className = v;
    else if (k === 'value' || k === 'checked' || k === 'selected' || k === 'disabled') el[k] = v;
    else el.setAttribute(k, v === true ? '' : String(v));
  }
  append(el, children);
  return el;
}

function append(el, children) {
  for (const c of children) {
    if (c === null || c === undefined || c === false) continue;
    if (Array.isArray(c)) append(el, c);
    else el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
}

/** A local date and time for an RFC 3339 string or a Date; `—` for none. */
export function fmtTime(value) {
  if (value === null || value === undefined) return '—';
  const d = value instanceof Date ? value : new Date(value);
  if (Number.isNaN(d.getTime())) return String(value);
  return d.toLocaleString(undefined, { dateStyle: 'medium', timeStyle: 'medium' });
}

/** A `<time>` element showing `value` locally, with the exact value as its datetime. */
export function time(value) {
  if (value === null || value === undefined) return h('span', { class: 'muted' }, '—');
  const d = value instanceof Date ? value : new Date(value);
  return h('time', { datetime: d.toISOString(), title: d.toISOString() }, fmtTime(d));
}

/** `1.5 MB` */
export function fmtBytes(n) {
  if (n === null || n === undefined) return '—';
  const units = ['B', 'KB', 'MB', 'GB', 'TB'];
  let i = 0;
  let v = n;
  while (v >= 1000 && i < units.length - 1) { v /= 1000; i += 1; }
  return `${v.toFixed(i === 0 ? 0 : 1)} ${units[i]}`;
}

/** `12.3 s` */
export function fmtSeconds(s) {
  return s === null || s === undefined ? '—' : `${Number(s).toFixed(1)} s`;
}

/** A coloured status badge; the word itself carries the meaning, colour only helps. */
export function badge(status) {
  const kind = {
    succeeded: 'ok', enabled: 'ok', ready: 'ok',
    failed: 'bad', disabled: 'bad', cancelled: 'bad',
    paused: 'warn', pending: 'info', running: 'info', processing: 'info',
  }[status] || 'info';
  return h('span', { class: `badge ${kind}`, 'data-status': status }, status);
}

/** A problem box: the problem detail's title and detail. */
export function problemBox(problem) {
  return h('div', { class: 'problem', role: 'alert' },
    h('strong', {}, problem.title || 'Error'),
    problem.detail ? h('span', { class: 'detail' }, problem.detail) : null,
    problem.code ? h('span', { class: 'small muted' }, ` (${problem.code}${problem.status ? `, HTTP ${problem.status}` : ''})`) : null);
}

/** The problem of any thrown value (ApiError or a bug). */
export function problemOf(e) {
  if (e && e.problem) return e.problem;
  return { title: 'Console error', detail: String(e && e.message ? e.message : e) };
}

/** Whether keyboard focus has been lost (to `<body>` or nowhere). */
function focusLost() {
  return !document.activeElement || document.activeElement === document.body;
}

/** Focuses the control whose `data-key` is `key`, if there is one. */
function focusKey(key) {
  const el = key ? document.querySelector(`[data-key="${CSS.escape(key)}"]`) : null;
  if (el && !el.disabled) el.focus();
  return Boolean(el && document.activeElement === el);
}

/**
 * Runs `render()`, which replaces part of the page, and gives keyboard focus
 * back to the control that had it (matched by its `data-key`, e.g.
 * `cancel:op_…`) when the re-render took it away; else to `fallback`.
 */
export function preservingFocus(render, fallback) {
  const active = document.activeElement;
  const key = active && active !== document.body ? active.dataset?.key : undefined;
  const result = render();
  if (key && focusLost() && !focusKey(key)) fallback?.focus();
  return result;
}

/**
 * Disables `button` while `work()` runs (so it is not pressed twice), then
 * gives focus back: disabling a focused button, or re-rendering it, drops
 * keyboard focus to `<body>`. Focus returns to the button (or its re-rendered
 * twin, by `data-key`), else to `<main>`.
 */
export async function busy(button, work) {
  const hadFocus = document.activeElement === button;
  const key = button.dataset.key;
  button.disabled = true;
  try {
    return await work();
  } finally {
    button.disabled = false;
    if (hadFocus && focusLost()) {
      if (button.isConnected) button.focus();
      else if (!focusKey(key)) document.getElementById('main')?.focus();
    }
  }
}

/** A `<select>` with a label, for filters. `options` is `[[value, text], …]`. */
export function selectField(id, label, options, value, onchange) {
  return h('div', { class: 'field' },
    h('label', { for: id }, label),
    h('select', { id, onchange }, options.map(([v, t]) => h('option', { value: v, selected: v === value }, t))));
}

/** A secret shown exactly once, with a copy button; `ondone` removes it. */
export function secretPanel(title, secret, ondone) {
  const copy = h('button', { type: 'button', class: 'secondary' }, 'Copy');
  const status = h('span', { class: 'small', role: 'status' });
  copy.addEventListener('click', async () => {
    try {
      await navigator.clipboard.writeText(secret);
      status.textContent = 'Copied.';
    } catch {
      status.textContent = 'Select the secret and copy it by hand.';
    }
  });
  const panel = h('section', { class: 'notice', 'aria-label': title, 'data-testid': 'secret-panel' },
    h('strong', {}, title),
    h('p', {}, 'Copy this signing secret now: it is shown only this once and cannot be shown again.'),
    h('code', { class: 'secret' }, secret),
    h('div', { class: 'actions' }, copy, h('button', { type: 'button', onclick: () => {
      panel.remove();
      ondone?.();
      if (focusLost()) document.getElementById('main')?.focus();
    } }, 'Done'), status));
  return panel;
}

export const EVENT_TYPES = ['video.processing', 'video.ready', 'video.failed', 'video.cancelled', 'webhook_endpoint.disabled'];

/**
 * `value` if it is an absolute http(s) URL, else null: URLs from the api go
 * into `href`/`src` only then (never `javascript:` or anything else).
 */
export function httpUrl(value) {
  if (typeof value !== 'string' || !value) return null;
  try {
    const u = new URL(value);
    return u.protocol === 'http:' || u.protocol === 'https:' ? u.href : null;
  } catch {
    return null;
  }
}
