// The api client of the console: same-origin fetch with the session's API key
// as a Bearer token. Errors become ApiError carrying the RFC 9457 problem.

const KEY = 'vid.console.apiKey';

/** The API key of this browser tab, or null. Kept in sessionStorage only. */
export function apiKey() {
  return sessionStorage.getItem(KEY);
}

/** Keeps the key for this browser tab (sessionStorage: gone when the tab closes). */
export function setApiKey(key) {
  sessionStorage.setItem(KEY, key);
}

/** Forgets the key. */
export function forgetApiKey() {
  sessionStorage.removeItem(KEY);
}

/** An error answer of the api (or no answer at all), with its problem detail. */
export class ApiError extends Error {
  constructor(problem) {
    super(problem.detail || problem.title);
    this.name = 'ApiError';
    /** `{title, detail, status, code}` */
    this.problem = problem;
  }
}

function headers(extra) {
  const h = { Accept: 'application/json, application/problem+json', ...extra };
  const key = apiKey();
  if (key) h.Authorization = `Bearer ${key}`;
  return h;
}

/** Turns a non-2xx response into an ApiError with the problem's title and detail. */
async function problemOf(resp) {
  const text = await resp.text().catch(() => '');
  let body = null;
  try { body = text ? JSON.parse(text) : null; } catch { /* not JSON */ }
  const p = body && typeof body === 'object' ? body : {};
  return new ApiError({
    title: typeof p.title === 'string' ? p.title : `HTTP ${resp.status} ${resp.statusText}`.trim(),
    detail: typeof p.detail === 'string' ? p.detail : text.slice(0, 300),
    status: resp.status,
    code: typeof p.code === 'string' ? p.code : undefined,
  });
}

/**
 * One path segment for an id taken from the location hash or a payload:
 * percent-encoded, and never `.` or `..` (which `fetch` would resolve as a
 * relative path, turning `#/videos/..` into a request for `/`).
 */
export function segment(id) {
  const s = String(id);
  if (!s || /^(\.|%2e){1,2}$/i.test(s)) {
    throw new ApiError({ title: 'Not found', detail: `\`${s}\` is not an id.`, status: 404, code: 'not_found' });
  }
  return encodeURIComponent(s);
}

/** Tells the console that the api refused the key (401), so it signs out. */
function unauthorized(error) {
  if (error.problem.status === 401) window.dispatchEvent(new CustomEvent('vid:unauthorized', { detail: error.problem }));
  return error;
}

function networkError(e) {
  return new ApiError({ title: 'Network error', detail: `The api could not be reached: ${e.message}`, status: 0 });
}

/**
 * Calls the api: `api('GET', '/operations')`, `api('POST', '/webhook-endpoints', {url})`.
 * Resolves to the parsed JSON (null for 204); rejects with ApiError.
 */
export async function api(method, path, body, { signal } = {}) {
  const init = { method, headers: headers(), signal, cache: 'no-store' };
  if (body !== undefined) {
    init.headers['Content-Type'] = 'application/json';
    init.body = JSON.stringify(body);
  }
  let resp;
  try {
    resp = await fetch(path, init);
  } catch (e) {
    if (e.name === 'AbortError') throw e;
    throw networkError(e);
  }
  if (!resp.ok) throw unauthorized(await problemOf(resp));
  if (resp.status === 204) return null;
  const text = await resp.text();
  return text ? JSON.parse(text) : null;
}

/** `/path?k=v` with the non-empty values of `params`. */
export function withQuery(path, params) {
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(params)) if (v !== undefined && v !== null && v !== '') q.set(k, v);
  const s = q.toString();
  return s ? `${path}?${s}` : path;
}

/**
 * Follows `GET /operations/{id}/events` (Server-Sent Events) and calls
 * `onOperation` with each operation snapshot until the stream ends (after the
 * terminal state) or `signal` aborts. EventSource cannot send an
 * Authorization header, so the stream is read with fetch.
 */
export async function streamOperation(id, onOperation, signal) {
  let resp;
  try {
    resp = await fetch(`/operations/${segment(id)}/events`, {
      headers: headers({ Accept: 'text/event-stream' }), signal, cache: 'no-store',
    });
  } catch (e) {
    if (e.name === 'AbortError') throw e;
    throw networkError(e);
  }
  if (resp.status === 204) return;
  if (!resp.ok) throw unauthorized(await problemOf(resp));
  const reader = resp.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = '';
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += value.replace(/\r\n?/g, '\n');
    let end;
    while ((end = buffer.indexOf('\n\n')) >= 0) {
      const block = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      const data = block.split('\n').filter((l) => l.startsWith('data:')).map((l) => l.slice(5).replace(/^ /, '')).join('\n');
      if (data) onOperation(JSON.parse(data));
    }
  }
}
