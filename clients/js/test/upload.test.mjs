// The library under node's test runner against the real api and Garage
// (scripts/console-test.sh starts them and sets the environment):
//   CLIENTJS_API_URL   the api
//   CLIENTJS_API_KEY   an API key (used only as "the customer's server" would: POST /uploads, GET /videos)
//   CLIENTJS_VIDEO     a real video larger than two parts (the api runs with 5 MiB parts)
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { basename } from 'node:path';
import { upload, cancel, findResumable, pendingUploads, UploadError, backoff } from '../src/index.js';

const API_URL = process.env.CLIENTJS_API_URL;
const API_KEY = process.env.CLIENTJS_API_KEY;
const VIDEO = process.env.CLIENTJS_VIDEO;
if (!API_URL || !API_KEY || !VIDEO) throw new Error('CLIENTJS_API_URL, CLIENTJS_API_KEY and CLIENTJS_VIDEO must be set (scripts/console-test.sh)');
const bytes = readFileSync(VIDEO);
const file = () => new File([bytes], basename(VIDEO), { type: 'video/mp4', lastModified: 1_700_000_000_000 });

/** A Storage-like map (node has no localStorage). */
class MemoryStore {
  #m = new Map();
  get length() { return this.#m.size; }
  key(i) { return [...this.#m.keys()][i] ?? null; }
  getItem(k) { return this.#m.get(k) ?? null; }
  setItem(k, v) { this.#m.set(k, String(v)); }
  removeItem(k) { this.#m.delete(k); }
}

/** What the customer's server does: POST /uploads with the API key. */
async function createUpload() {
  const resp = await fetch(`${API_URL}/uploads`, {
    method: 'POST',
    headers: { Authorization: `Bearer ${API_KEY}`, 'Content-Type': 'application/json' },
    body: JSON.stringify({ size_bytes: bytes.length, content_type: 'video/mp4', filename: basename(VIDEO) }),
  });
  assert.equal(resp.status, 201, await resp.clone().text());
  const created = await resp.json();
  assert.match(created.client_token, /^vidu_[A-Za-z0-9_-]{43}$/);
  assert.ok(created.parts.length >= 2, `the video must span several parts (got ${created.parts.length})`);
  return created;
}

test('backoff grows, is capped and jittered', () => {
  assert.equal(backoff(1, () => 0), 150);
  assert.equal(backoff(1, () => 1), 300);
  assert.equal(backoff(3, () => 1), 1200);
  assert.equal(backoff(20, () => 1), 10_000);
  assert.ok(backoff(2, () => 0.5) > backoff(2, () => 0));
});

test('an API key is refused before any request', async () => {
  await assert.rejects(upload(file(), { upload: 'upl_x', token: API_KEY, apiUrl: API_URL, store: null }), (e) => e instanceof UploadError && e.code === 'api_key_refused' && !e.retryable);
});

test('a real video in several parts, in parallel, completed and followed to succeeded', async () => {
  const created = await createUpload();
  const seen = new Set();
  const store = new MemoryStore();
  const result = await upload(file(), {
    upload: created, token: created.client_token, apiUrl: API_URL, parallel: 3, follow: true, store,
    onProgress: (p) => { for (const part of p.parts) if (part.state === 'sending') seen.add(part.part_number); },
  });
  assert.equal(result.operation.status, 'succeeded', JSON.stringify(result.operation));
  assert.deepEqual([...result.partsSent].sort(), created.parts.map((p) => p.part_number).sort());
  assert.deepEqual(result.partsAlreadyStored, []);
  assert.equal(seen.size, created.parts.length);
  assert.equal(pendingUploads(store).length, 0, 'a finished upload is forgotten');
  // The video exists for the tenant (API key), and the token cannot list videos.
  const video = await fetch(`${API_URL}/videos/${result.videoId}`, { headers: { Authorization: `Bearer ${API_KEY}` } });
  assert.equal(video.status, 200);
  const list = await fetch(`${API_URL}/videos`, { headers: { Authorization: `Bearer ${created.client_token}` } });
  assert.equal(list.status, 401);
});

test('stopped after one part, then resumed from GET /uploads: only the missing parts are sent', async () => {
  const created = await createUpload();
  const store = new MemoryStore();
  const controller = new AbortController();
  const first = upload(file(), {
    upload: created, token: created.client_token, apiUrl: API_URL, parallel: 1, store, signal: controller.signal,
    onProgress: (p) => { if (p.parts.some((x) => x.state === 'done')) controller.abort(); },
  });
  await assert.rejects(first, (e) => e instanceof UploadError && e.code === 'aborted');
  // "After a reload": the file is chosen again and recognised by its fingerprint.
  const saved = await findResumable(file(), store);
  assert.ok(saved, 'the stopped upload is resumable');
  assert.equal(saved.uploadId, created.id);
  const other = new File([bytes.subarray(0, bytes.length - 1), Buffer.from([bytes[bytes.length - 1] ^ 1])], basename(VIDEO), { type: 'video/mp4', lastModified: 1_700_000_000_000 });
  assert.equal(await findResumable(other, store), null, 'a file differing in its last part is not the same file');
  const state = await (await fetch(`${API_URL}/uploads/${created.id}`, { headers: { Authorization: `Bearer ${saved.token}` } })).json();
  assert.ok(state.parts.length >= 1 && state.missing_parts.length >= 1, JSON.stringify(state));
  const result = await upload(file(), { upload: saved.uploadId, token: saved.token, apiUrl: API_URL, store });
  assert.deepEqual([...result.partsAlreadyStored].sort(), state.parts.map((p) => p.part_number).sort());
  assert.deepEqual([...result.partsSent].sort(), [...state.missing_parts].sort());
  assert.ok(['pending', 'running', 'succeeded'].includes(result.operation.status), result.operation.status);
});

test('cancel aborts the upload; uploading it again is refused with its code', async () => {
  const created = await createUpload();
  const store = new MemoryStore();
  await cancel(created.id, { token: created.client_token, apiUrl: API_URL, store });
  await assert.rejects(
    upload(file(), { upload: created, token: created.client_token, apiUrl: API_URL, store }),
    (e) => e instanceof UploadError && e.code === 'upload_aborted' && e.status === 409 && !e.retryable,
  );
  // Another upload's id with this token: 404, as for an unknown id.
  const other = await createUpload();
  await assert.rejects(
    upload(file(), { upload: other.id, token: created.client_token, apiUrl: API_URL, store }),
    (e) => e instanceof UploadError && e.code === 'not_found' && e.status === 404,
  );
});
