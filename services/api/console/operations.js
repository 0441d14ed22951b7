// Operations page: live status and progress of the tenant's operations.
// Non-terminal operations are followed over Server-Sent Events
// (`/operations/{id}/events`); the list itself is re-read every few seconds
// to pick up new operations. Cancel for non-terminal ones; a link to the video.

import { api, segment, streamOperation } from './api.js';
import { h, time, badge, busy, preservingFocus, problemBox, problemOf } from './dom.js';

const TERMINAL = new Set(['succeeded', 'failed', 'cancelled']);
const MAX_STREAMS = 5;
const LIST_REFRESH_MS = 4000;

function videoId(op) {
  return op.result?.video_id || op.metadata?.video_id || null;
}

function progressCell(op) {
  const value = op.status === 'succeeded' ? 100 : op.progress;
  const label = `Progress of ${op.id}`;
  return h('div', { class: 'progress' },
    h('progress', { max: 100, value, 'aria-label': label }),
    h('span', { class: 'num' }, `${value}%`),
    op.metadata?.phase && !TERMINAL.has(op.status) ? h('span', { class: 'small muted' }, op.metadata.phase) : null);
}

/** Renders the page. */
export async function render(ctx) {
  const notices = h('div', { 'aria-live': 'polite' });
  const body = h('tbody');
  const empty = h('p', { class: 'muted', hidden: true }, 'No operations yet. Upload a video, e.g. vidctl upload movie.mp4.');
  // Not a live region: it changes every few seconds and would drown a screen reader.
  const status = h('p', { class: 'small muted' });
  const rowsById = new Map();
  const streams = new Map();

  function row(op) {
    const vid = videoId(op);
    let cancel = null;
    if (!TERMINAL.has(op.status)) {
      cancel = h('button', { type: 'button', class: 'danger', 'data-key': `cancel:${op.id}`, 'aria-label': `Cancel operation ${op.id}` }, 'Cancel');
      cancel.addEventListener('click', () => busy(cancel, async () => {
        try {
          update(await api('POST', `/operations/${segment(op.id)}:cancel`));
        } catch (e) {
          notices.replaceChildren(problemBox(problemOf(e)));
        }
      }));
    }
    return h('tr', { 'data-operation-id': op.id, 'data-operation-status': op.status },
      h('td', { class: 'mono small' }, op.id),
      h('td', {}, badge(op.status),
        op.error ? h('div', { class: 'small wrap' }, `${op.error.title}${op.error.detail ? `: ${op.error.detail}` : ''}`) : null),
      h('td', {}, progressCell(op)),
      h('td', {}, time(op.created_at)),
      h('td', {}, time(op.updated_at)),
      h('td', {}, vid ? h('a', { class: 'mono small', href: `#/videos/${encodeURIComponent(vid)}`, 'data-key': `video:${op.id}` }, vid) : h('span', { class: 'muted' }, '—')),
      h('td', {}, cancel));
  }

  /** Shows the newest snapshot of an operation (older ones are ignored). */
  function update(op) {
    const old = rowsById.get(op.id);
    if (old) {
      if (JSON.stringify(old.op) === JSON.stringify(op)) return;
      if (TERMINAL.has(old.op.status) && !TERMINAL.has(op.status)) return;
      if (!TERMINAL.has(op.status) && new Date(old.op.updated_at) > new Date(op.updated_at)) return;
    }
    const tr = row(op);
    // A progress tick re-renders the row: keep keyboard focus on its Cancel button or link.
    if (old) preservingFocus(() => old.tr.replaceWith(tr), ctx.main); else body.append(tr);
    rowsById.set(op.id, { op, tr });
  }

  function follow(op) {
    if (TERMINAL.has(op.status) || streams.has(op.id) || streams.size >= MAX_STREAMS) return;
    const ac = new AbortController();
    ctx.signal.addEventListener('abort', () => ac.abort());
    streams.set(op.id, ac);
    streamOperation(op.id, update, ac.signal)
      .catch((e) => {
        // A refused or broken stream: the list refresh keeps the row current.
        if (e.name !== 'AbortError') status.textContent = `Live updates of ${op.id} stopped (${problemOf(e).title}); refreshing by polling.`;
      })
      .finally(() => streams.delete(op.id));
  }

  async function load() {
    const page = await api('GET', '/operations?limit=50', undefined, { signal: ctx.signal });
    // Newest first: rebuild the order, keep rows that streams keep current.
    const seen = new Set();
    for (const op of page.data) {
      seen.add(op.id);
      update(op);
    }
    // (Moving a row drops keyboard focus inside it: give it back.)
    preservingFocus(() => { for (const op of page.data) body.append(rowsById.get(op.id).tr); });
    for (const [id, { tr }] of rowsById) if (!seen.has(id)) { tr.remove(); rowsById.delete(id); }
    empty.hidden = page.data.length > 0;
    for (const op of page.data) follow(op);
    status.textContent = `${streams.size} operation(s) followed live; list refreshed ${new Date().toLocaleTimeString()}.`;
  }

  ctx.main.replaceChildren(
    h('h1', {}, 'Operations'),
    notices,
    status,
    h('table', { 'data-testid': 'operations' },
      h('thead', {}, h('tr', {}, ['Operation', 'Status', 'Progress', 'Created', 'Updated', 'Video', 'Actions'].map((c) => h('th', { scope: 'col' }, c)))),
      body),
    empty);
  await load();
  const timer = setInterval(() => load().catch((e) => { if (e.name !== 'AbortError') notices.replaceChildren(problemBox(problemOf(e))); }), LIST_REFRESH_MS);
  ctx.signal.addEventListener('abort', () => clearInterval(timer));
}
