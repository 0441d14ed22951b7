// The console's shell: sign-in, navigation (hash routes), the error banner.
// Each page is a module exporting `render(ctx)`; ctx.signal aborts when the
// user leaves the page (stopping its timers and streams).

import { api, apiKey, setApiKey, forgetApiKey, ApiError } from './api.js';
import { h, problemBox, problemOf } from './dom.js';
import * as endpoints from './endpoints.js';
import * as endpoint from './endpoint.js';
import * as events from './events.js';
import * as operations from './operations.js';
import * as video from './video.js';

const routes = [
  [/^\/endpoints$/, endpoints, 'endpoints'],
  [/^\/endpoints\/([^/]+)$/, endpoint, 'endpoints'],
  [/^\/events$/, events, 'events'],
  [/^\/operations$/, operations, 'operations'],
  [/^\/videos\/([^/]+)$/, video, 'operations'],
];

const main = document.getElementById('main');
const banner = document.getElementById('error');
let current = null;

/** Shows a problem (title and detail) in the banner at the top of the page. */
export function showProblem(problem) {
  const box = problemBox(problem);
  banner.replaceChildren(...[...box.childNodes]);
  banner.hidden = false;
}

function clearProblem() {
  banner.hidden = true;
  banner.replaceChildren();
}

function renderSession() {
  const nav = document.getElementById('nav');
  const session = document.getElementById('session');
  if (apiKey()) {
    nav.hidden = false;
    session.replaceChildren(
      h('span', {}, 'Signed in with an API key'),
      h('button', { type: 'button', class: 'secondary', onclick: signOut }, 'Sign out'));
  } else {
    nav.hidden = true;
    session.replaceChildren();
  }
}

function signOut() {
  forgetApiKey();
  location.hash = '#/signin';
  route();
}

function renderSignIn(next) {
  const input = h('input', { id: 'api-key', name: 'api-key', type: 'password', autocomplete: 'off', spellcheck: 'false', required: true, 'aria-describedby': 'api-key-help' });
  const error = h('div');
  const submit = h('button', { type: 'submit' }, 'Sign in');
  const form = h('form', { class: 'stack panel' },
    h('div', { class: 'field' }, h('label', { for: 'api-key' }, 'API key'), input),
    h('p', { id: 'api-key-help', class: 'small muted' },
      'Paste an API key (vidk_…). It is kept for this browser tab only, sent as a Bearer token to this api, and never shown again.'),
    h('div', {}, submit),
    error);
  form.addEventListener('submit', async (ev) => {
    ev.preventDefault();
    const key = input.value.trim();
    input.value = '';
    error.replaceChildren();
    submit.disabled = true;
    setApiKey(key);
    try {
      await api('GET', '/operations?limit=1');
      location.hash = next && next !== '/signin' ? `#${next}` : '#/endpoints';
      route();
    } catch (e) {
      forgetApiKey();
      error.replaceChildren(problemBox(problemOf(e)));
      submit.disabled = false;
      input.focus();
    }
  });
  main.replaceChildren(h('section', { class: 'signin' }, h('h1', {}, 'Sign in'), form));
  renderSession();
  input.focus();
}

/** Renders the page the location hash names. */
async function route() {
  current?.abort();
  current = new AbortController();
  clearProblem();
  const hash = decodeURIComponent(location.hash.replace(/^#/, '')) || '/endpoints';
  const [path, query = ''] = hash.split('?');
  if (!apiKey()) {
    renderSignIn(path);
    return;
  }
  renderSession();
  const found = routes.map(([re, page, section]) => [path.match(re), page, section]).find(([m]) => m);
  for (const a of document.querySelectorAll('#nav a')) {
    if (found && a.dataset.section === found[2]) a.setAttribute('aria-current', 'page');
    else a.removeAttribute('aria-current');
  }
  if (!found) {
    main.replaceChildren(h('h1', {}, 'Not found'), problemBox({ title: 'Not found', detail: `The console has no page ${path}.` }));
    return;
  }
  const [match, page] = found;
  const ctx = {
    main,
    params: match.slice(1),
    query: new URLSearchParams(query),
    signal: current.signal,
    showProblem,
    clearProblem,
  };
  main.replaceChildren(h('p', { class: 'muted' }, 'Loading…'));
  try {
    await page.render(ctx);
  } catch (e) {
    if (e.name === 'AbortError' || ctx.signal.aborted) return;
    handleError(e, ctx);
  }
}

function handleError(e, ctx) {
  if (e instanceof ApiError && e.problem.status === 401) {
    forgetApiKey();
    renderSignIn(location.hash.replace(/^#/, ''));
    showProblem(e.problem);
    return;
  }
  const problem = problemOf(e);
  // Never a blank page: the page keeps its heading and shows the problem.
  if (!main.querySelector('h1')) main.replaceChildren(h('h1', {}, 'Something went wrong'));
  main.querySelectorAll(':scope > p.muted').forEach((p) => p.remove());
  main.append(problemBox(problem));
  if (ctx) ctx.clearProblem();
}

window.addEventListener('hashchange', route);
window.addEventListener('unhandledrejection', (ev) => {
  if (ev.reason && ev.reason.name === 'AbortError') return;
  showProblem(problemOf(ev.reason));
});
window.addEventListener('error', (ev) => showProblem({ title: 'Console error', detail: ev.message }));
route();
