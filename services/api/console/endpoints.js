// Endpoints page: the list with status, success rate and last attempt; create
// (the secret is shown once), rotate the secret, enable.

import { api, segment } from './api.js';
import { h, time, badge, busy, preservingFocus, problemBox, problemOf, secretPanel, EVENT_TYPES } from './dom.js';

/** `42% (21 of 50)`, or `—` when nothing was attempted. */
export function successRate(health) {
  if (!health || health.success_rate === null || health.success_rate === undefined) {
    return h('span', { class: 'muted' }, 'no attempts yet');
  }
  const pct = Math.round(health.success_rate * 100);
  return h('span', { 'data-testid': 'success-rate' }, `${pct}%`,
    h('span', { class: 'small muted' }, ` (${health.recent_succeeded} of ${health.recent_deliveries})`));
}

/** `HTTP 500` / `timeout` / `HTTP 200` for an attempt-like object. */
export function attemptResult(status, errorClass) {
  if (status !== null && status !== undefined) {
    const ok = status >= 200 && status < 300;
    return h('span', { class: `badge ${ok ? 'ok' : 'bad'}`, 'data-http-status': status }, `HTTP ${status}`);
  }
  if (errorClass) return h('span', { class: 'badge bad', 'data-error-class': errorClass }, errorClass);
  return h('span', { class: 'muted' }, '—');
}

/** Status badge plus the reason and time an endpoint was disabled, or until when it is throttled. */
export function endpointStatus(ep) {
  return h('span', {}, badge(ep.status),
    ep.status === 'disabled' && ep.disabled_reason ? h('span', { class: 'small' }, ` ${ep.disabled_reason}`) : null,
    ep.status === 'disabled' && ep.disabled_at ? h('span', { class: 'small muted' }, ' since ', time(ep.disabled_at)) : null,
    ep.status === 'enabled' && ep.throttled_until
      ? h('span', { class: 'small muted', 'data-throttled-until': ep.throttled_until }, ' throttled (429/503) until ', time(ep.throttled_until))
      : null,
    ep.status === 'enabled' && ep.concurrency_limit
      ? h('span', { class: 'small muted', 'data-concurrency-limit': ep.concurrency_limit }, ` slowed to ${ep.concurrency_limit} at a time`)
      : null);
}

/** Rotate-secret and enable buttons; `notices` is where the secret or a problem appears. */
export function endpointActions(ep, notices, reload) {
  const rotate = h('button', { type: 'button', class: 'secondary', 'data-key': `rotate:${ep.id}`, 'aria-label': `Rotate the secret of ${ep.url}` }, 'Rotate secret');
  rotate.addEventListener('click', () => busy(rotate, async () => {
    try {
      const r = await api('POST', `/webhook-endpoints/${segment(ep.id)}:rotate-secret`);
      notices.replaceChildren(secretPanel(`New secret for ${ep.url}`, r.secret),
        h('p', { class: 'small muted' }, 'The previous secret also signs deliveries until ', time(r.previous_secret_expires_at), '.'));
    } catch (e) {
      notices.replaceChildren(problemBox(problemOf(e)));
    }
  }));
  const buttons = [rotate];
  if (ep.status === 'disabled') {
    const enable = h('button', { type: 'button', 'data-key': `enable:${ep.id}`, 'aria-label': `Enable ${ep.url}` }, 'Enable');
    enable.addEventListener('click', () => busy(enable, async () => {
      try {
        await api('POST', `/webhook-endpoints/${segment(ep.id)}:enable`);
        notices.replaceChildren(h('p', { class: 'notice', role: 'status' }, `${ep.url} is enabled; its paused deliveries are being sent.`));
        await reload();
      } catch (e) {
        notices.replaceChildren(problemBox(problemOf(e)));
      }
    }));
    buttons.push(enable);
  }
  return h('div', { class: 'actions' }, buttons);
}

function createForm(notices, reload) {
  const url = h('input', { id: 'new-url', type: 'url', required: true, placeholder: 'https://hooks.example.com/video', size: 48 });
  const description = h('input', { id: 'new-description', type: 'text', maxlength: 1024, size: 32 });
  const types = EVENT_TYPES.map((t) => h('label', {}, h('input', { type: 'checkbox', name: 'event_types', value: t }), ` ${t}`));
  const submit = h('button', { type: 'submit' }, 'Create endpoint');
  const form = h('form', { class: 'stack panel', 'aria-labelledby': 'create-heading' },
    h('h2', { id: 'create-heading' }, 'New endpoint'),
    h('div', { class: 'field' }, h('label', { for: 'new-url' }, 'Endpoint URL'), url),
    h('div', { class: 'field' }, h('label', { for: 'new-description' }, 'Description (optional)'), description),
    h('fieldset', {}, h('legend', {}, 'Event types (none checked: every type)'), types),
    h('div', {}, submit));
  form.addEventListener('submit', (ev) => {
    ev.preventDefault();
    busy(submit, () => create());
  });
  async function create() {
    const body = { url: url.value.trim() };
    if (description.value.trim()) body.description = description.value.trim();
    const checked = [...form.querySelectorAll('input[name=event_types]:checked')].map((i) => i.value);
    if (checked.length) body.event_types = checked;
    try {
      const created = await api('POST', '/webhook-endpoints', body);
      form.reset();
      notices.replaceChildren(secretPanel(`Endpoint created: ${created.url}`, created.secret));
      await reload();
    } catch (e) {
      notices.replaceChildren(problemBox(problemOf(e)));
    }
  }
  return form;
}

/** Renders the page. */
export async function render(ctx) {
  const notices = h('div', { 'aria-live': 'polite' });
  const list = h('div', {}, h('p', { class: 'muted' }, 'Loading…'));
  const reload = async () => {
    const { data } = await api('GET', '/webhook-endpoints', undefined, { signal: ctx.signal });
    preservingFocus(() => list.replaceChildren(table(data, notices, reload)), ctx.main);
  };
  ctx.main.replaceChildren(h('h1', {}, 'Endpoints'), notices, list, createForm(notices, reload));
  await reload();
}

function table(endpoints, notices, reload) {
  if (!endpoints.length) return h('p', { class: 'muted' }, 'No endpoints yet. Create one below.');
  return h('table', { 'data-testid': 'endpoints' },
    h('caption', {}, 'Success rate and last attempt over each endpoint\'s latest 100 deliveries'),
    h('thead', {}, h('tr', {}, ['URL', 'Status', 'Success rate', 'Last attempt', 'Actions'].map((c) => h('th', { scope: 'col' }, c)))),
    h('tbody', {}, endpoints.map((ep) => h('tr', { 'data-endpoint-id': ep.id },
      h('td', { class: 'wrap' }, h('a', { href: `#/endpoints/${encodeURIComponent(ep.id)}`, 'data-key': `open:${ep.id}` }, ep.url),
        ep.description ? h('div', { class: 'small muted' }, ep.description) : null),
      h('td', {}, endpointStatus(ep)),
      h('td', { class: 'num' }, successRate(ep.health)),
      h('td', {}, ep.health && ep.health.last_attempt_at
        ? [time(ep.health.last_attempt_at), ' ', attemptResult(ep.health.last_attempt_status, ep.health.last_attempt_error_class)]
        : h('span', { class: 'muted' }, 'never')),
      h('td', {}, endpointActions(ep, notices, reload))))));
}
