// Endpoint detail: its recent deliveries (newest first), each expandable to
// its attempts; Resend; filters by status and event type. Refreshes itself
// every few seconds while open.

import { api, segment, withQuery } from './api.js';
import { h, time, badge, busy, preservingFocus, problemBox, problemOf, selectField, EVENT_TYPES } from './dom.js';
import { attemptResult, endpointActions, endpointStatus } from './endpoints.js';

const STATUSES = ['pending', 'succeeded', 'failed', 'paused'];
const REFRESH_MS = 3000;

/** Renders the page. */
export async function render(ctx) {
  const id = ctx.params[0];
  const filters = { status: ctx.query.get('status') || '', event_type: ctx.query.get('event_type') || '' };
  const expanded = new Set();
  const notices = h('div', { 'aria-live': 'polite' });
  const header = h('div');
  const deliveries = h('div', {}, h('p', { class: 'muted' }, 'Loading deliveries…'));
  // Not a live region: it changes every few seconds and would drown a screen reader.
  const live = h('p', { class: 'small muted' });
  let lastJson = '';
  let cursor = null;

  const onFilter = (key) => (ev) => {
    filters[key] = ev.target.value;
    const q = withQuery('', filters);
    history.replaceState(null, '', `#/endpoints/${encodeURIComponent(id)}${q}`);
    lastJson = '';
    loadDeliveries().catch(showError);
  };
  const filterBar = h('form', { class: 'row', 'aria-label': 'Filter deliveries', onsubmit: (e) => e.preventDefault() },
    selectField('filter-status', 'Status', [['', 'Any status'], ...STATUSES.map((s) => [s, s])], filters.status, onFilter('status')),
    selectField('filter-event-type', 'Event type', [['', 'Any event type'], ...EVENT_TYPES.map((t) => [t, t])], filters.event_type, onFilter('event_type')),
    h('button', { type: 'button', class: 'secondary', onclick: () => { lastJson = ''; loadDeliveries().catch(showError); } }, 'Refresh'));

  function showError(e) {
    if (e.name === 'AbortError') return;
    notices.replaceChildren(problemBox(problemOf(e)));
  }

  async function loadEndpoint() {
    const ep = await api('GET', `/webhook-endpoints/${segment(id)}`, undefined, { signal: ctx.signal });
    header.replaceChildren(
      h('p', { class: 'breadcrumb' }, h('a', { href: '#/endpoints' }, '← Endpoints')),
      h('h1', {}, ep.url),
      h('div', { class: 'panel' },
        h('dl', { class: 'meta' },
          h('dt', {}, 'Id'), h('dd', { class: 'mono' }, ep.id),
          h('dt', {}, 'Status'), h('dd', {}, endpointStatus(ep)),
          h('dt', {}, 'Description'), h('dd', {}, ep.description || '—'),
          h('dt', {}, 'Event types'), h('dd', {}, ep.event_types ? ep.event_types.join(', ') : 'every type'),
          h('dt', {}, 'Signature format'), h('dd', {}, ep.signature_format),
          h('dt', {}, 'Created'), h('dd', {}, time(ep.created_at))),
        h('div', { class: 'actions' }, endpointActions(ep, notices, loadEndpoint))));
  }

  async function loadDeliveries(more = false) {
    const page = await api('GET', withQuery(`/webhook-endpoints/${segment(id)}/deliveries`,
      { ...filters, limit: 50, cursor: more ? cursor : '' }), undefined, { signal: ctx.signal });
    live.textContent = `Updated ${new Date().toLocaleTimeString()}; refreshes every ${REFRESH_MS / 1000} s.`;
    if (more) {
      cursor = page.next_cursor;
      deliveries.querySelector('tbody')?.append(...page.data.flatMap((d) => rows(d)));
      preservingFocus(moreButton, ctx.main);
      return;
    }
    const json = JSON.stringify(page.data);
    if (json === lastJson) return;
    lastJson = json;
    cursor = page.next_cursor;
    preservingFocus(() => {
      deliveries.replaceChildren(page.data.length ? deliveryTable(page.data) : h('p', { class: 'muted' }, 'No deliveries match.'));
      moreButton();
    }, ctx.main);
  }

  function moreButton() {
    deliveries.querySelector('.more')?.remove();
    if (cursor) deliveries.append(h('button', { type: 'button', class: 'secondary more', 'data-key': 'older-deliveries', onclick: () => loadDeliveries(true).catch(showError) }, 'Older deliveries'));
  }

  function deliveryTable(data) {
    return h('table', { 'data-testid': 'deliveries' },
      h('caption', {}, 'Newest first'),
      h('thead', {}, h('tr', {}, ['', 'Event', 'Status', 'Attempts', 'Last result', 'Last attempt', 'Next attempt', 'Actions'].map((c) => h('th', { scope: 'col' }, c || h('span', { class: 'visually-hidden' }, 'Expand'))))),
      h('tbody', {}, data.flatMap((d) => rows(d))));
  }

  function rows(d) {
    const last = d.attempts[d.attempts.length - 1];
    const detailId = `attempts-${d.id}`;
    const open = expanded.has(d.id);
    const toggle = h('button', { type: 'button', class: 'link', 'data-key': `attempts:${d.id}`, 'aria-expanded': String(open), 'aria-controls': detailId },
      open ? '▾' : '▸', h('span', { class: 'visually-hidden' }, ` attempts of delivery ${d.id}`), ` ${d.attempts.length}`);
    const detail = h('tr', { class: 'detail', id: detailId, hidden: !open }, h('td', { colspan: 8 }, attemptsTable(d)));
    toggle.addEventListener('click', () => {
      const now = !expanded.has(d.id);
      if (now) expanded.add(d.id); else expanded.delete(d.id);
      toggle.setAttribute('aria-expanded', String(now));
      toggle.firstChild.textContent = now ? '▾' : '▸';
      detail.hidden = !now;
    });
    const resend = h('button', { type: 'button', 'data-key': `resend:${d.id}`, 'aria-label': `Resend delivery ${d.id}` }, 'Resend');
    resend.addEventListener('click', () => busy(resend, async () => {
      try {
        await api('POST', `/webhook-endpoints/${segment(id)}/deliveries/${segment(d.id)}:retry`);
        notices.replaceChildren(h('p', { class: 'notice', role: 'status' }, `Delivery ${d.id} (${d.event_type}) will be sent again now.`));
        lastJson = '';
        await loadDeliveries();
      } catch (e) {
        showError(e);
      }
    }));
    return [
      h('tr', { 'data-delivery-id': d.id, 'data-delivery-status': d.status },
        h('td', {}, toggle),
        h('td', {}, h('div', {}, d.event_type), h('a', { class: 'small mono', href: `#/events?id=${encodeURIComponent(d.event_id)}` }, d.event_id)),
        h('td', {}, badge(d.status)),
        h('td', { class: 'num' }, String(d.attempt_count)),
        h('td', {}, last ? attemptResult(last.response_status, last.error_class) : h('span', { class: 'muted' }, 'not attempted')),
        h('td', {}, time(d.last_attempt_at)),
        h('td', {}, d.status === 'pending' ? time(d.next_attempt_at) : h('span', { class: 'muted' }, '—')),
        h('td', {}, resend)),
      detail,
    ];
  }

  ctx.main.replaceChildren(header, notices, h('h2', {}, 'Recent deliveries'), filterBar, live, deliveries);
  await loadEndpoint();
  await loadDeliveries();
  const timer = setInterval(() => loadDeliveries().catch(showError), REFRESH_MS);
  ctx.signal.addEventListener('abort', () => clearInterval(timer));
}

function attemptsTable(d) {
  if (!d.attempts.length) return h('p', { class: 'muted' }, 'No attempt yet.');
  return h('table', { 'aria-label': `Attempts of delivery ${d.id}` },
    h('thead', {}, h('tr', {}, ['#', 'Time', 'Result', 'Duration', 'Response', 'Next attempt'].map((c) => h('th', { scope: 'col' }, c)))),
    h('tbody', {}, d.attempts.map((a) => h('tr', { 'data-attempt': a.attempt_number },
      h('td', { class: 'num' }, String(a.attempt_number)),
      h('td', {}, time(a.started_at)),
      h('td', {}, attemptResult(a.response_status, a.error_class), a.error_detail ? h('div', { class: 'small muted wrap' }, a.error_detail) : null),
      h('td', { class: 'num' }, `${a.duration_ms} ms`),
      h('td', {}, a.response_body ? h('pre', {}, a.response_body) : h('span', { class: 'muted' }, '—')),
      h('td', {}, time(a.next_attempt_at))))));
}
