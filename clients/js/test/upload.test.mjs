// The library under node's test runner against the real api and Garage
// (scripts/console-test.sh starts them and sets the environment):
//   CLIENTJS_API_URL   the api
//   CLIENTJS_API_KEY   an API key (used only as "the customer's server" would: POST /uploads, GET /videos)
//   CLIENTJS_VIDEO     a real video larger than two parts (the api runs with 5 MiB parts)
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { basename } from 'node:path';
import { upload, cancel, findResumable, pendingUploads, UploadError, backoff, STORAGE_PREFIX } from '../src/index.js';

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
  assert.match(result.videoId ?? '', /^vid_/, 'videoId comes from the operation\'s metadata without follow');
  assert.equal(result.videoId, result.operation.metadata.video_id);
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

test('an API key padded with spaces is refused too, and bad arguments fail at once', async () => {
  for (const token of [` ${API_KEY}`, `${API_KEY}\n`, `\t${API_KEY} `]) {
    await assert.rejects(upload(file(), { upload: 'upl_x', token, apiUrl: API_URL, store: null }), (e) => e instanceof UploadError && e.code === 'api_key_refused');
  }
  // A closed loopback port: reaching the network would be a retryable `network` after seconds.
  const nowhere = 'http://127.0.0.1:9';
  for (const parallel of [NaN, 0, -1, 1.5, '2']) {
    const started = Date.now();
    await assert.rejects(
      upload(file(), { upload: 'upl_x', token: 'vidu_x', apiUrl: nowhere, parallel, store: null }),
      (e) => e instanceof UploadError && e.code === 'invalid_argument' && !e.retryable,
      String(parallel),
    );
    assert.ok(Date.now() - started < 1000, 'refused before any request');
  }
  await assert.rejects(upload(file(), { upload: 'upl_x', token: 'vidu_x', store: null }), (e) => e instanceof UploadError && e.code === 'invalid_argument' && !e.retryable);
});

test('an abort in the first onProgress sends no part', async () => {
  const created = await createUpload();
  const controller = new AbortController();
  let calls = 0;
  await assert.rejects(
    upload(file(), {
      upload: created, token: created.client_token, apiUrl: API_URL, parallel: 2, store: null, signal: controller.signal,
      onProgress: () => { calls += 1; if (calls === 1) controller.abort(); },
    }),
    (e) => e instanceof UploadError && e.code === 'aborted',
  );
  const state = await (await fetch(`${API_URL}/uploads/${created.id}`, { headers: { Authorization: `Bearer ${created.client_token}` } })).json();
  assert.equal(state.parts.length, 0, `no part reached storage: ${JSON.stringify(state.parts)}`);
  assert.equal(state.missing_parts.length, created.parts.length);
});

test('resuming with another file than the saved one is not_resumable and keeps the record', async () => {
  const created = await createUpload();
  const store = new MemoryStore();
  const controller = new AbortController();
  await assert.rejects(upload(file(), {
    upload: created, token: created.client_token, apiUrl: API_URL, parallel: 1, store, signal: controller.signal,
    onProgress: (p) => { if (p.parts.some((x) => x.state === 'done')) controller.abort(); },
  }), (e) => e instanceof UploadError && e.code === 'aborted');
  const key = `${STORAGE_PREFIX}${created.id}`;
  const record = store.getItem(key);
  assert.ok(record, 'the stopped upload was saved');
  const before = await (await fetch(`${API_URL}/uploads/${created.id}`, { headers: { Authorization: `Bearer ${created.client_token}` } })).json();
  // Same size, name and date, other last byte.
  const other = new File([bytes.subarray(0, bytes.length - 1), Buffer.from([bytes[bytes.length - 1] ^ 1])], basename(VIDEO), { type: 'video/mp4', lastModified: 1_700_000_000_000 });
  await assert.rejects(
    upload(other, { upload: created.id, token: created.client_token, apiUrl: API_URL, store }),
    (e) => e instanceof UploadError && e.code === 'not_resumable' && !e.retryable,
  );
  assert.equal(store.getItem(key), record, 'the saved record is not overwritten');
  const after = await (await fetch(`${API_URL}/uploads/${created.id}`, { headers: { Authorization: `Bearer ${created.client_token}` } })).json();
  assert.deepEqual(after.missing_parts, before.missing_parts, 'nothing of the other file was sent');
});
