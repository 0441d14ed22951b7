// Events page: every event of the tenant with its type, time and the resource
// it names, and a view of its exact payload. `#/events?id=evt_…` shows one.

import { api, segment, withQuery } from './api.js';
import { h, time, selectField, problemBox, problemOf, EVENT_TYPES } from './dom.js';

/** A link to what an event is about: the video, or the endpoint. */
function resource(data) {
  if (!data) return h('span', { class: 'muted' }, '—');
  if (data.video_id) {
    return h('span', {}, 'video ', h('a', { class: 'mono', href: `#/videos/${encodeURIComponent(data.video_id)}` }, data.video_id),
      data.version !== undefined ? h('span', { class: 'small muted' }, ` v${data.version}`) : null);
  }
  if (data.endpoint_id) {
    return h('span', {}, 'endpoint ', h('a', { class: 'mono', href: `#/endpoints/${encodeURIComponent(data.endpoint_id)}` }, data.endpoint_id),
      data.reason ? h('span', { class: 'small muted' }, ` ${data.reason}`) : null);
  }
  return h('span', { class: 'muted' }, '—');
}

function rows(ev) {
  const detailId = `payload-${ev.id}`;
  const toggle = h('button', { type: 'button', class: 'secondary', 'aria-expanded': 'false', 'aria-controls': detailId }, 'Show payload');
  const detail = h('tr', { class: 'detail', id: detailId, hidden: true }, h('td', { colspan: 5 }, h('pre', {}, JSON.stringify(ev, null, 2))));
  toggle.addEventListener('click', () => {
    const open = detail.hidden;
    detail.hidden = !open;
    toggle.setAttribute('aria-expanded', String(open));
    toggle.textContent = open ? 'Hide payload' : 'Show payload';
  });
  return [
    h('tr', { 'data-event-id': ev.id },
      h('td', {}, ev.type),
      h('td', {}, time(new Date(ev.created * 1000))),
      h('td', {}, resource(ev.data)),
      h('td', { class: 'mono small' }, ev.id),
      h('td', {}, toggle)),
    detail,
  ];
}

/** Renders the page. */
export async function render(ctx) {
  const only = ctx.query.get('id');
  const type = ctx.query.get('type') || '';
  const body = h('tbody');
  const list = h('div');
  const notices = h('div');
  let cursor = null;
  const table = h('table', { 'data-testid': 'events' },
    h('thead', {}, h('tr', {}, ['Type', 'Time', 'Resource', 'Id', 'Payload'].map((c) => h('th', { scope: 'col' }, c)))), body);
  const more = h('button', { type: 'button', class: 'secondary', hidden: true }, 'Older events');
  more.addEventListener('click', () => load().catch((e) => notices.replaceChildren(problemBox(problemOf(e)))));

  async function load() {
    const page = await api('GET', withQuery('/events', { type, limit: 50, cursor }), undefined, { signal: ctx.signal });
    body.append(...page.data.flatMap(rows));
    cursor = page.next_cursor;
    more.hidden = !cursor;
    if (!body.children.length) list.replaceChildren(h('p', { class: 'muted' }, 'No events yet.'));
  }

  if (only) {
    ctx.main.replaceChildren(h('p', { class: 'breadcrumb' }, h('a', { href: '#/events' }, '← All events')), h('h1', {}, `Event ${only}`), notices, list);
    const ev = await api('GET', `/events/${segment(only)}`, undefined, { signal: ctx.signal });
    body.append(...rows(ev));
    list.replaceChildren(table);
    body.querySelector('button[aria-controls]')?.click();
    return;
  }
  const filter = h('form', { class: 'row', 'aria-label': 'Filter events', onsubmit: (e) => e.preventDefault() },
    selectField('filter-type', 'Event type', [['', 'Any event type'], ...EVENT_TYPES.map((t) => [t, t])], type, (e) => {
      location.hash = withQuery('#/events', { type: e.target.value });
    }));
  list.replaceChildren(table);
  ctx.main.replaceChildren(h('h1', {}, 'Events'), filter, notices, list, more);
  await load();
}
