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
import * as uploadPage from './upload.js';

const routes = [
  [/^\/endpoints$/, endpoints, 'endpoints'],
  [/^\/endpoints\/([^/]+)$/, endpoint, 'endpoints'],
  [/^\/events$/, events, 'events'],
  [/^\/operations$/, operations, 'operations'],
  [/^\/videos\/([^/]+)$/, video, 'operations'],
  [/^\/upload$/, uploadPage, 'upload'],
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

// Tabs opened from this one (window.open, "open in new tab") start with a
// copy of its sessionStorage, key included: signing out tells them all.
const tabs = 'BroadcastChannel' in window ? new BroadcastChannel('vid-console') : null;
if (tabs) {
  tabs.onmessage = (ev) => {
    if (ev.data === 'signed-out' && apiKey()) {
      forgetApiKey();
      route();
    }
  };
}

function signOut() {
  forgetApiKey();
  tabs?.postMessage('signed-out');
  current?.abort();
  history.replaceState(null, '', '#/signin');
  route();
}

// Any 401 (a revoked key, also from a page's periodic refresh): forget the key
// and ask for one again, keeping the page to come back to.
let signingIn = false;
window.addEventListener('vid:unauthorized', (ev) => {
  if (signingIn || !apiKey()) return;
  forgetApiKey();
  current?.abort();
  renderSignIn();
  showProblem(ev.detail);
});

/** An API key is `vidk_` and printable ASCII; anything else cannot even be sent as a header. */
function keyProblem(key) {
  if (!key) return { title: 'No API key', detail: 'Paste an API key (vidk_…).' };
  if (!/^[\x21-\x7e]+$/.test(key)) return { title: 'Not an API key', detail: 'An API key is vidk_ followed by letters, digits, - and _; what was pasted has spaces or other characters.' };
  return null;
}

/** The sign-in form; once signed in, the console shows the page the location hash names. */
function renderSignIn() {
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
    clearProblem();
    const bad = keyProblem(key);
    if (bad) {
      error.replaceChildren(problemBox(bad));
      input.focus();
      return;
    }
    submit.disabled = true;
    setApiKey(key);
    signingIn = true;
    try {
      await api('GET', '/operations?limit=1');
      const { path, malformed } = parseHash();
      if (malformed || path === '/signin') history.replaceState(null, '', '#/endpoints');
      route();
    } catch (e) {
      forgetApiKey();
      error.replaceChildren(problemBox(problemOf(e)));
      submit.disabled = false;
      input.focus();
    } finally {
      signingIn = false;
    }
  });
  main.replaceChildren(h('section', { class: 'signin' }, h('h1', {}, 'Sign in'), form));
  renderSession();
  input.focus();
}

/**
 * The console path and query of the location hash: `#/endpoints/ep_1?status=failed`.
 * Only the path is percent-decoded here (the query by URLSearchParams); a
 * malformed escape (`#/endpoints/%`) is a page that does not exist, not a crash.
 */
function parseHash() {
  const raw = location.hash.replace(/^#/, '');
  const at = raw.indexOf('?');
  const rawPath = at < 0 ? raw : raw.slice(0, at);
  const query = at < 0 ? '' : raw.slice(at + 1);
  try {
    return { path: decodeURIComponent(rawPath) || '/endpoints', query, malformed: false };
  } catch {
    return { path: rawPath, query, malformed: true };
  }
}

/** Renders the page the location hash names. */
async function route() {
  current?.abort();
  current = new AbortController();
  clearProblem();
  const { path, query, malformed } = parseHash();
  if (!apiKey()) {
    renderSignIn();
    return;
  }
  if (path === '/signin') {
    // Signed in already (e.g. Back after signing in): go to the first page.
    history.replaceState(null, '', '#/endpoints');
    route();
    return;
  }
  renderSession();
  const found = routes.map(([re, page, section]) => [path.match(re), page, section]).find(([m]) => m);
  for (const a of document.querySelectorAll('#nav a')) {
    if (found && a.dataset.section === found[2]) a.setAttribute('aria-current', 'page');
    else a.removeAttribute('aria-current');
  }
  if (!found || malformed) {
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
  // Keyboard focus: back on the same control if the new page has it (a filter
  // <select> that changed the hash), else on <main>, not lost on <body>.
  const focusedId = document.activeElement?.id;
  main.replaceChildren(h('p', { class: 'muted' }, 'Loading…'));
  try {
    await page.render(ctx);
    if (!ctx.signal.aborted) {
      const again = focusedId && document.getElementById(focusedId);
      if (again && main.contains(again)) again.focus(); else if (!main.contains(document.activeElement)) main.focus({ preventScroll: true });
    }
  } catch (e) {
    if (e.name === 'AbortError' || ctx.signal.aborted) return;
    handleError(e, ctx);
  }
}

function handleError(e, ctx) {
  // A 401 already signed out (the `vid:unauthorized` listener).
  if (e instanceof ApiError && e.problem.status === 401) return;
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
