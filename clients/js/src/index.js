// @ts-check
/**
 * Browser uploads straight to storage with a client token (issue 21).
 *
 * The page never holds the API key: the customer's server calls
 * `POST /uploads` (API key) and hands the page the answer, whose
 * `client_token` (`vidu_…`) is good only for that upload and the operation it
 * becomes. {@link upload} then PUTs the parts in parallel to their presigned
 * S3 UploadPart URLs, retries a failed part alone (exponential backoff with
 * jitter), renews expired part URLs with `POST /uploads/{id}/parts:sign`,
 * resumes after a reload from `GET /uploads/{id}` (only missing parts are
 * sent), stops on an `AbortSignal`, calls `POST /uploads/{id}/complete` and can
 * follow the operation's event stream (`GET /operations/{id}/events`, read
 * with `fetch`: `EventSource` cannot send `Authorization`).
 *
 * No dependencies; runs in browsers and in Node ≥ 20 (global `fetch`, `Blob`,
 * `crypto.subtle`).
 */

/** Default number of parts in flight. */
export const DEFAULT_PARALLEL = 4;
/** Tries per part (the first included) before the upload fails. */
export const MAX_PART_ATTEMPTS = 6;
/** Re-signs of one part's URL (expired or refused) before the upload fails. */
export const MAX_RESIGNS = 3;
/** A part URL expiring sooner than this (ms) is renewed before use. */
const EXPIRY_MARGIN_MS = 30_000;
/** The localStorage key prefix of resumable uploads. */
export const STORAGE_PREFIX = 'vid-upload:';

/**
 * An upload or api failure: the RFC 9457 problem's `code`, the HTTP `status`
 * (0: no answer, e.g. a network error) and whether trying again may help.
 */
export class UploadError extends Error {
  /**
   * @param {string} code stable code: the api's problem `code`, or one of
   *   `network`, `storage_refused`, `aborted`, `api_key_refused`, `not_resumable`,
   *   `invalid_argument`, `invalid_token`, `invalid_upload`
   * @param {number} status HTTP status, 0 without an answer
   * @param {string} message human-readable detail
   * @param {{retryable?: boolean, problem?: any, partNumber?: number}} [extra]
   */
  constructor(code, status, message, extra = {}) {
    super(message);
    this.name = 'UploadError';
    this.code = code;
    this.status = status;
    this.retryable = extra.retryable ?? (status === 0 || status === 429 || status >= 500);
    this.problem = extra.problem;
    this.partNumber = extra.partNumber;
  }
}

/** Whether a status is worth retrying (RFC 9110: 408, 429, 5xx; 0 = no answer). */
const retryableStatus = (status) => status === 0 || status === 408 || status === 429 || status >= 500;

/**
 * Refuses anything that looks like an API key: it must never reach a page.
 * Returns the token trimmed (what is sent), so `' vidk_…'` is refused too.
 * @returns {string}
 */
function checkToken(token) {
  if (typeof token === 'string') token = token.trim();
  if (typeof token !== 'string' || token.length === 0) {
    throw new UploadError('invalid_token', 0, 'token is required: the client_token (vidu_…) of POST /uploads', { retryable: false });
  }
  if (token.startsWith('vidk_')) {
    throw new UploadError(
      'api_key_refused', 0,
      'this is an API key (vidk_…): never put it in a web page; pass the upload\'s client_token (vidu_…) instead',
      { retryable: false },
    );
  }
  return token;
}

/** A caller's mistake, reported at once (never retried). */
const badArgument = (message) => new UploadError('invalid_argument', 0, message, { retryable: false });

/** The api's base URL without a trailing `/`: `apiUrl`, else the page's origin; `invalid_argument` without either. */
function baseUrl(apiUrl) {
  const url = apiUrl ?? globalThis.location?.origin;
  if (typeof url !== 'string' || url.trim() === '' || url === 'null') {
    throw badArgument('apiUrl is required outside a web page (the api\'s base URL, e.g. https://api.example.com)');
  }
  return url.trim().replace(/\/$/, '');
}

/** An abort as an UploadError. */
const aborted = () => new UploadError('aborted', 0, 'the upload was stopped (AbortSignal)', { retryable: false });

/** Resolves after `ms`, or rejects at once on abort. */
function sleep(ms, signal) {
  return new Promise((resolve, reject) => {
    if (signal?.aborted) return reject(aborted());
    const t = setTimeout(() => { signal?.removeEventListener('abort', onAbort); resolve(undefined); }, ms);
    const onAbort = () => { clearTimeout(t); reject(aborted()); };
    signal?.addEventListener('abort', onAbort, { once: true });
  });
}

/**
 * Delay before try `attempt` (1-based retries): exponential from 300 ms,
 * capped at 10 s, with "equal jitter" (half fixed, half random) so parts that
 * failed together do not retry together.
 */
export function backoff(attempt, random = Math.random) {
  const ceiling = Math.min(10_000, 300 * 2 ** (attempt - 1));
  return ceiling / 2 + random() * (ceiling / 2);
}

/**
 * One call to the api with the client token. Throws UploadError for a
 * non-2xx answer (with the problem's code) or no answer (`network`).
 * @returns {Promise<Response>}
 */
async function api(apiUrl, token, method, path, { body, signal, headers = {} } = {}) {
  let resp;
  try {
    resp = await fetch(`${apiUrl}${path}`, {
      method,
      signal,
      headers: { Authorization: `Bearer ${token}`, ...(body !== undefined ? { 'Content-Type': 'application/json' } : {}), ...headers },
      body: body !== undefined ? JSON.stringify(body) : undefined,
    });
  } catch (e) {
    if (signal?.aborted) throw aborted();
    throw new UploadError('network', 0, `${method} ${path}: ${e?.message ?? e}`);
  }
  if (!resp.ok) {
    let problem;
    try { problem = await resp.json(); } catch { problem = undefined; }
    throw new UploadError(problem?.code ?? `http_${resp.status}`, resp.status, problem?.detail ?? `${method} ${path} answered ${resp.status}`, { problem });
  }
  return resp;
}

/** Calls the api, retrying retryable failures with backoff. */
async function apiRetrying(apiUrl, token, method, path, opts = {}) {
  for (let attempt = 1; ; attempt++) {
    try {
      return await api(apiUrl, token, method, path, opts);
    } catch (e) {
      if (!(e instanceof UploadError) || !e.retryable || attempt >= MAX_PART_ATTEMPTS) throw e;
      await sleep(backoff(attempt), opts.signal);
    }
  }
}

/** Hex SHA-256 of bytes. */
async function sha256Hex(bytes) {
  const digest = await globalThis.crypto.subtle.digest('SHA-256', bytes);
  return Array.from(new Uint8Array(digest), (b) => b.toString(16).padStart(2, '0')).join('');
}

/**
 * The cheap fingerprint that proves a file chosen again is the one an upload
 * started with: name, size, lastModified, and the SHA-256 of its first and
 * last part (`partSize` bytes each), so reading it costs at most two parts.
 * @param {Blob & {name?: string, lastModified?: number}} file
 * @param {number} partSize
 */
export async function fingerprint(file, partSize) {
  const first = await file.slice(0, Math.min(partSize, file.size)).arrayBuffer();
  const lastStart = Math.max(0, file.size - (file.size % partSize || partSize));
  const last = await file.slice(lastStart, file.size).arrayBuffer();
  const hash = await sha256Hex(new Uint8Array([...new Uint8Array(await globalThis.crypto.subtle.digest('SHA-256', first)), ...new Uint8Array(await globalThis.crypto.subtle.digest('SHA-256', last))]));
  return `${file.name ?? ''}|${file.size}|${file.lastModified ?? 0}|${hash}`;
}

/** The default store of resumable uploads: `localStorage` when there is one. */
function defaultStore() {
  try { return globalThis.localStorage ?? null; } catch { return null; }
}

/**
 * The resumable uploads the store holds (oldest first): what a page offers to
 * resume after a reload. Each: `{ uploadId, token, apiUrl, name, size,
 * lastModified, partSize, fingerprint, savedAt }`.
 * @param {Storage | null} [store]
 */
export function pendingUploads(store = defaultStore()) {
  if (!store) return [];
  const out = [];
  for (let i = 0; i < store.length; i++) {
    const key = store.key(i);
    if (!key?.startsWith(STORAGE_PREFIX)) continue;
    try { out.push(JSON.parse(store.getItem(key) ?? '')); } catch { /* not ours */ }
  }
  return out.sort((a, b) => a.savedAt - b.savedAt);
}

/** Forgets a resumable upload. */
export function forget(uploadId, store = defaultStore()) {
  store?.removeItem(`${STORAGE_PREFIX}${uploadId}`);
}

/**
 * The stored upload `file` continues, if any: same name, size and
 * lastModified, and the same hash of its first and last part.
 * @param {Blob & {name?: string, lastModified?: number}} file
 * @param {Storage | null} [store]
 */
export async function findResumable(file, store = defaultStore()) {
  for (const saved of pendingUploads(store).reverse()) {
    if (saved.name !== (file.name ?? '') || saved.size !== file.size || saved.lastModified !== (file.lastModified ?? 0)) continue;
    if ((await fingerprint(file, saved.partSize)) === saved.fingerprint) return saved;
  }
  return null;
}

/**
 * PUTs one part's bytes to its presigned URL; resolves to the ETag. Uses
 * XMLHttpRequest where there is one (upload progress events), else `fetch`.
 * Throws UploadError (`storage_refused` with the status, or `network`).
 */
function putPart(url, blob, signal, onBytes) {
  if (typeof globalThis.XMLHttpRequest === 'function') {
    return new Promise((resolve, reject) => {
      const xhr = new XMLHttpRequest();
      const onAbort = () => xhr.abort();
      signal?.addEventListener('abort', onAbort, { once: true });
      xhr.open('PUT', url);
      xhr.upload.onprogress = (e) => onBytes(e.loaded);
      xhr.onload = () => {
        signal?.removeEventListener('abort', onAbort);
        if (xhr.status >= 200 && xhr.status < 300) resolve(xhr.getResponseHeader('ETag') ?? '');
        else reject(new UploadError('storage_refused', xhr.status, `storage answered ${xhr.status}: ${xhr.responseText.slice(0, 300)}`, { retryable: retryableStatus(xhr.status) }));
      };
      xhr.onerror = () => { signal?.removeEventListener('abort', onAbort); reject(new UploadError('network', 0, 'the part PUT failed (network or CORS)')); };
      xhr.onabort = () => { signal?.removeEventListener('abort', onAbort); reject(aborted()); };
      xhr.send(blob);
    });
  }
  return (async () => {
    let resp;
    try {
      resp = await fetch(url, { method: 'PUT', body: blob, signal });
    } catch (e) {
      if (signal?.aborted) throw aborted();
      throw new UploadError('network', 0, `the part PUT failed: ${e?.message ?? e}`);
    }
    const text = await resp.text();
    if (!resp.ok) throw new UploadError('storage_refused', resp.status, `storage answered ${resp.status}: ${text.slice(0, 300)}`, { retryable: retryableStatus(resp.status) });
    onBytes(blob.size);
    return resp.headers.get('ETag') ?? '';
  })();
}

/**
 * Whether storage refused a part's URL itself (expired or bad signature:
 * S3 403 `AccessDenied`, Garage 400/403 "expired", `SignatureDoesNotMatch`),
 * so a fresh URL may work.
 */
function urlRefused(e) {
  return e instanceof UploadError && e.code === 'storage_refused' && (e.status === 403 || (e.status === 400 && /expired|signature|AccessDenied/i.test(e.message)));
}

/**
 * Uploads `file` to an upload created by `POST /uploads`.
 *
 * @param {Blob & {name?: string, lastModified?: number}} file the file (a `File`, or any `Blob`)
 * @param {import('./index').UploadOptions} options
 * @returns {Promise<import('./index').UploadResult>}
 */
export async function upload(file, options) {
  const { parallel = DEFAULT_PARALLEL, onProgress = () => {}, signal, follow = false } = options;
  const token = checkToken(options.token);
  if (!Number.isInteger(parallel) || parallel < 1) throw badArgument(`parallel must be a whole number ≥ 1 (got ${parallel})`);
  const store = options.store === undefined ? defaultStore() : options.store;
  const apiUrl = baseUrl(options.apiUrl);
  const created = typeof options.upload === 'string' ? { id: options.upload } : options.upload;
  if (!created?.id) throw new UploadError('invalid_upload', 0, 'upload must be the POST /uploads answer or its id', { retryable: false });
  if (signal?.aborted) throw aborted();
  const id = created.id;
  // One controller stops every request and PUT: the page's signal (listened
  // to from the start, so an abort in the first onProgress counts), or the
  // first part that fails for good (the other workers drop their PUT and stop).
  const inner = new AbortController();
  const stopInner = () => inner.abort();
  signal?.addEventListener('abort', stopInner, { once: true });
  const stop = inner.signal;
  try {
    return await run();
  } finally {
    signal?.removeEventListener('abort', stopInner);
  }

  async function run() {

  const state = await (await apiRetrying(apiUrl, token, 'GET', `/uploads/${id}`, { signal })).json();
  if (state.size_bytes !== file.size) {
    throw new UploadError('not_resumable', 0, `the file has ${file.size} bytes; upload ${id} expects ${state.size_bytes}`, { retryable: false });
  }
  const partSize = state.part_size;
  const partCount = state.part_count;
  const lengthOf = (n) => (n < partCount ? partSize : file.size - partSize * (partCount - 1));
  /** @type {Map<number, {part_number:number, length:number, loaded:number, state:string, attempts:number}>} */
  const parts = new Map();
  for (let n = 1; n <= partCount; n++) parts.set(n, { part_number: n, length: lengthOf(n), loaded: 0, state: 'stored', attempts: 0 });
  const missing = state.status === 'created' ? state.missing_parts : [];
  for (const n of missing) Object.assign(parts.get(n), { state: 'pending' });
  for (const p of parts.values()) if (p.state === 'stored') p.loaded = p.length;
  const alreadyStored = [...parts.values()].filter((p) => p.state === 'stored').map((p) => p.part_number);

  let phase = 'uploading';
  let operation = null;
  const report = () => {
    const list = [...parts.values()].map((p) => ({ ...p }));
    onProgress({ uploadId: id, phase, loaded: list.reduce((s, p) => s + p.loaded, 0), total: file.size, parts: list, operation });
  };

  if (state.status === 'created' && store) {
    const print = await fingerprint(file, partSize);
    let saved = null;
    try { saved = JSON.parse(store.getItem(`${STORAGE_PREFIX}${id}`) ?? 'null'); } catch { saved = null; }
    if (saved?.fingerprint && saved.fingerprint !== print) {
      // Another file than the one this upload started with: its stored parts
      // would be completed with this file's other parts. The record stays.
      throw new UploadError('not_resumable', 0, `this file is not the one upload ${id} started with (its fingerprint differs)`, { retryable: false });
    }
    const record = { uploadId: id, token, apiUrl, name: file.name ?? '', size: file.size, lastModified: file.lastModified ?? 0, partSize, fingerprint: print, savedAt: Date.now() };
    try { store.setItem(`${STORAGE_PREFIX}${id}`, JSON.stringify(record)); } catch { /* quota: the upload goes on without resume */ }
  }
  if (stop.aborted) throw aborted();
  if (state.status !== 'created' && state.status !== 'completed') {
    forget(id, store);
    throw new UploadError(`upload_${state.status}`, 409, `upload ${id} is ${state.status}; start a new upload`, { retryable: false });
  }

  /** Part URLs: from the create answer, renewed with parts:sign. */
  const urls = new Map((created.parts ?? []).map((p) => [p.part_number, p]));
  const sign = async (numbers, s = signal) => {
    for (let i = 0; i < numbers.length; i += 100) {
      const batch = numbers.slice(i, i + 100);
      const signed = await (await apiRetrying(apiUrl, token, 'POST', `/uploads/${id}/parts:sign`, { body: { part_numbers: batch }, signal: s })).json();
      for (const p of signed.parts) urls.set(p.part_number, p);
    }
  };
  const fresh = (n) => {
    const u = urls.get(n);
    return u && Date.parse(u.expires_at) - Date.now() > EXPIRY_MARGIN_MS;
  };
  const unsigned = missing.filter((n) => !fresh(n));
  if (unsigned.length) await sign(unsigned);
  report();
  if (stop.aborted) throw aborted();

  const sent = [];
  const queue = [...missing];
  const sendPart = async (n) => {
    const part = parts.get(n);
    const offset = (n - 1) * partSize;
    let resigns = 0;
    for (;;) {
      if (stop.aborted) throw aborted();
      if (!fresh(n)) await sign([n], stop);
      part.state = 'sending';
      part.attempts += 1;
      part.loaded = 0;
      report();
      try {
        await putPart(urls.get(n).url, file.slice(offset, offset + part.length), stop, (bytes) => { part.loaded = Math.min(bytes, part.length); report(); });
        part.loaded = part.length;
        part.state = 'done';
        sent.push(n);
        report();
        return;
      } catch (e) {
        part.loaded = 0;
        if (stop.aborted || e?.code === 'aborted') {
          part.state = 'pending';
          throw aborted();
        }
        if (urlRefused(e) && resigns < MAX_RESIGNS) {
          resigns += 1;
          urls.delete(n);
          part.state = 'retrying';
          report();
          continue;
        }
        if (!(e instanceof UploadError) || !e.retryable || part.attempts >= MAX_PART_ATTEMPTS) {
          part.state = 'failed';
          report();
          if (e instanceof UploadError) e.partNumber = n;
          throw e;
        }
        part.state = 'retrying';
        report();
        await sleep(backoff(part.attempts), stop);
      }
    }
  };
  let failure = null;
  const worker = async () => {
    while (queue.length && !failure && !stop.aborted) {
      const n = /** @type {number} */ (queue.shift());
      try {
        await sendPart(n);
      } catch (e) {
        failure ??= e;
        inner.abort();
      }
    }
  };
  await Promise.all(Array.from({ length: Math.max(1, Math.min(parallel, queue.length || 1)) }, worker));
  if (signal?.aborted) {
    report();
    throw aborted();
  }
  if (failure) throw failure;

  phase = 'completing';
  report();
  let accepted;
  if (state.status === 'completed') {
    accepted = await (await apiRetrying(apiUrl, token, 'GET', `/operations/${state.operation_id}`, { signal })).json();
  } else {
    accepted = await (await apiRetrying(apiUrl, token, 'POST', `/uploads/${id}/complete`, { signal })).json();
  }
  forget(id, store);
  operation = accepted;
  phase = 'processing';
  report();
  if (follow) {
    operation = await followOperation(accepted.id, { apiUrl, token, signal, onUpdate: (op) => { operation = op; report(); } });
    phase = operation.status;
    report();
  }
  // `metadata.video_id` is set from the complete answer on, so no `follow` is needed.
  const videoId = operation?.metadata?.video_id ?? operation?.result?.video_id ?? null;
  return { uploadId: id, operation, videoId, partsSent: sent, partsAlreadyStored: alreadyStored };
  }
}

/**
 * Follows an operation to `succeeded`, `failed` or `cancelled` over its event
 * stream (`GET /operations/{id}/events`, Server-Sent Events read with `fetch`
 * so that `Authorization` can be sent; reconnects with `Last-Event-ID` when
 * the stream ends early, e.g. an api replica stopping). Resolves to the
 * terminal operation; `onUpdate` sees every state on the way.
 * @param {string} operationId
 * @param {{apiUrl?: string, token: string, signal?: AbortSignal, onUpdate?: (op: any) => void}} options
 */
export async function followOperation(operationId, { apiUrl, token, signal, onUpdate = () => {} }) {
  token = checkToken(token);
  apiUrl = baseUrl(apiUrl);
  let lastId = null;
  let last = null;
  for (let attempt = 1; ; attempt++) {
    let resp;
    try {
      resp = await api(apiUrl, token, 'GET', `/operations/${operationId}/events`, { signal, headers: { Accept: 'text/event-stream', ...(lastId !== null ? { 'Last-Event-ID': String(lastId) } : {}) } });
    } catch (e) {
      if (!(e instanceof UploadError) || !e.retryable || attempt >= MAX_PART_ATTEMPTS) throw e;
      await sleep(backoff(attempt), signal);
      continue;
    }
    if (resp.status === 204) {
      return last ?? (await (await api(apiUrl, token, 'GET', `/operations/${operationId}`, { signal })).json());
    }
    const reader = /** @type {ReadableStream<Uint8Array>} */ (resp.body).pipeThrough(new TextDecoderStream()).getReader();
    let buffer = '';
    try {
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buffer += value;
        let end;
        while ((end = buffer.search(/\r?\n\r?\n/)) >= 0) {
          const block = buffer.slice(0, end);
          buffer = buffer.slice(end).replace(/^\r?\n\r?\n/, '');
          let data = '';
          for (const line of block.split(/\r?\n/)) {
            if (line.startsWith('data:')) data += line.slice(5).trimStart();
            else if (line.startsWith('id:')) lastId = line.slice(3).trim();
          }
          if (!data) continue;
          last = JSON.parse(data);
          onUpdate(last);
          if (['succeeded', 'failed', 'cancelled'].includes(last.status)) {
            reader.cancel().catch(() => {});
            return last;
          }
        }
      }
    } catch (e) {
      if (signal?.aborted) throw aborted();
    }
    attempt = 0;
    await sleep(500, signal);
  }
}

/**
 * Aborts an upload for good (`DELETE /uploads/{id}`) and forgets it. Pausing
 * is aborting the `signal` only: the upload stays resumable.
 * @param {string} uploadId
 * @param {{apiUrl?: string, token: string, store?: Storage | null}} options
 */
export async function cancel(uploadId, { apiUrl, token, store = defaultStore() }) {
  token = checkToken(token);
  await apiRetrying(baseUrl(apiUrl), token, 'DELETE', `/uploads/${uploadId}`);
  forget(uploadId, store);
}
