// The console's upload page (issue 21) in Debian's headless Chromium, driven
// with playwright-core, against the real api, storage (Garage), transcoder and
// playback service that scripts/console-test.sh started. The page creates
// uploads with the operator's API key and sends them with the upload library
// (clients/js) holding only the client token.
//
//   1. a real video in several parts; part 2's first PUT is made to fail by
//      route interception and only part 2 is sent again; the video page opens;
//   2. a reload in the middle (part 1 stored, the others held back), then
//      resume from the "Unfinished uploads" list: only the missing parts are sent;
//   3. a cancel in the middle: the upload is aborted;
//   4. three files at once all reach `succeeded` with at most 2 event streams
//      open (the others poll), so the page keeps connections for its api calls.
//
// Environment (scripts/console-test.sh): CONSOLE_API_URL, CONSOLE_API_KEY,
// CONSOLE_UPLOAD_VIDEO (a real video of several 5 MiB parts), CONSOLE_OUT, CHROMIUM.
import { join } from 'node:path';
import { readFileSync, statSync } from 'node:fs';
import { chromium } from 'playwright-core';

const API_URL = process.env.CONSOLE_API_URL;
const API_KEY = process.env.CONSOLE_API_KEY;
const VIDEO = process.env.CONSOLE_UPLOAD_VIDEO;
const OUT = process.env.CONSOLE_OUT;
if (!API_URL || !API_KEY || !VIDEO || !OUT) throw new Error('run scripts/console-test.sh (CONSOLE_API_URL, CONSOLE_API_KEY, CONSOLE_UPLOAD_VIDEO, CONSOLE_OUT)');
const PART = 5 * 1024 * 1024;
const PARTS = Math.ceil(statSync(VIDEO).size / PART);
if (PARTS < 3) throw new Error(`${VIDEO} must span at least 3 parts of 5 MiB`);

function assert(cond, message) { if (!cond) throw new Error(`assertion failed: ${message}`); }
async function eventually(what, fn, timeoutMs = 90_000) {
  const deadline = Date.now() + timeoutMs;
  let last;
  for (;;) {
    try { last = await fn(); if (last) return last; } catch (e) { last = e; }
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what} (last: ${last})`);
    await new Promise((r) => setTimeout(r, 200));
  }
}
/** The upload as the API key sees it. */
const uploadState = async (id) => (await fetch(`${API_URL}/uploads/${id}`, { headers: { Authorization: `Bearer ${API_KEY}` } })).json();
const partOf = (url) => Number(new URL(url).searchParams.get('partNumber'));
const isPartPut = (r) => r.method() === 'PUT' && new URL(r.url()).searchParams.has('partNumber');

const browser = await chromium.launch({ executablePath: process.env.CHROMIUM ?? '/usr/bin/chromium', headless: true, args: ['--no-sandbox', '--disable-gpu', '--disable-dev-shm-usage'] });
const context = await browser.newContext({ viewport: { width: 1280, height: 900 } });
await context.route('**/*', (route) => (['127.0.0.1', 'localhost'].includes(new URL(route.request().url()).hostname) ? route.continue() : route.abort('blockedbyclient')));
const page = await context.newPage();
page.setDefaultTimeout(30_000);
const errors = [];
page.on('pageerror', (e) => errors.push(e.message));
/** Every part PUT the browser sent: part number per request. */
let puts = [];
page.on('request', (r) => { if (isPartPut(r)) puts.push(partOf(r.url())); });
const apiKeyRequests = [];
page.on('request', (r) => {
  const auth = r.headers().authorization ?? '';
  if (auth.includes('vidk_') && !/\/uploads$/.test(new URL(r.url()).pathname) && new URL(r.url()).pathname.startsWith('/uploads/')) apiKeyRequests.push(r.url());
});
const shot = (name) => page.screenshot({ path: join(OUT, `upload-${name}.png`), fullPage: true });
const started = Date.now();
const step = async (name, fn) => { console.log(`[${((Date.now() - started) / 1000).toFixed(1)} s] ${name}`); await fn(); };

try {
  await page.goto(`${API_URL}/console/#/upload`);
  await page.locator('#api-key').fill(API_KEY);
  await page.getByRole('button', { name: 'Sign in' }).click();
  await page.locator('main h1', { hasText: 'Upload' }).waitFor();

  await step('several parts; part 2 fails once and only it is sent again', async () => {
    let failed = 0;
    await page.route(/partNumber=2(&|$)/, async (route) => {
      if (route.request().method() === 'PUT' && failed === 0) { failed += 1; return route.abort('connectionreset'); }
      return route.continue();
    });
    puts = [];
    await page.locator('#upload-files').setInputFiles(VIDEO);
    const row = page.locator('[data-upload]').first();
    await row.locator('[data-role=video-link]').waitFor({ timeout: 90_000 });
    assert((await row.getAttribute('data-phase')) === 'succeeded', `phase ${await row.getAttribute('data-phase')}`);
    assert(failed === 1, 'the interception failed part 2 once');
    const counts = Object.fromEntries([...Array(PARTS)].map((_, i) => [i + 1, puts.filter((n) => n === i + 1).length]));
    assert(counts[2] === 2, `part 2 sent twice: ${JSON.stringify(counts)}`);
    for (let n = 1; n <= PARTS; n++) if (n !== 2) assert(counts[n] === 1, `part ${n} sent once: ${JSON.stringify(counts)}`);
    assert((await row.locator('[data-part]').count()) === PARTS, 'one progress bar per part');
    await shot('succeeded');
    await page.unroute(/partNumber=2(&|$)/);
    await row.locator('[data-role=video-link]').click();
    await page.locator('main h1').waitFor();
    assert(/#\/videos\/vid_/.test(page.url()), page.url());
  });

  await step('reload in the middle, then resume: only the missing parts are sent', async () => {
    await page.goto(`${API_URL}/console/#/upload`);
    await page.locator('main h1', { hasText: 'Upload' }).waitFor();
    // Part 1 goes through; the others are held until the page reloads.
    const held = [];
    const hold = (route) => (partOf(route.request().url()) === 1 ? route.continue().catch(() => {}) : held.push(route));
    await page.route(/partNumber=/, hold);
    await page.locator('#upload-files').setInputFiles(VIDEO);
    const row = page.locator('[data-upload]').first();
    const id = await row.getAttribute('data-upload');
    await eventually('part 1 in storage', async () => (await uploadState(id)).parts?.some((p) => p.part_number === 1));
    // Reload while parts 2.. are held (unrouting first would let them go on).
    await page.reload();
    for (const r of held) await r.abort().catch(() => {});
    await page.unroute(/partNumber=/, hold);
    await page.locator('main h1', { hasText: 'Upload' }).waitFor();
    const pending = page.locator(`[data-pending="${id}"]`);
    await pending.waitFor();
    await shot('resume-offered');
    const state = await uploadState(id);
    assert(state.status === 'created' && state.missing_parts.length === PARTS - 1, JSON.stringify(state));
    puts = [];
    await page.locator(`[data-resume="${id}"]`).setInputFiles(VIDEO);
    const resumed = page.locator(`[data-upload="${id}"]`);
    await eventually('the resumed upload completed', async () => ['processing', 'succeeded'].includes(await resumed.getAttribute('data-phase')), 120_000);
    assert(JSON.stringify([...puts].sort()) === JSON.stringify(state.missing_parts), `sent ${puts}, missing were ${state.missing_parts}`);
    assert(!puts.includes(1), 'part 1 was not sent again');
    await shot('resumed');
  });

  await step('cancel in the middle', async () => {
    await page.goto(`${API_URL}/console/#/upload`);
    await page.locator('main h1', { hasText: 'Upload' }).waitFor();
    const held = [];
    const hold = (route) => { held.push(route); };
    await page.route(/partNumber=/, hold);
    const before = await page.locator('[data-upload]').count();
    await page.locator('#upload-files').setInputFiles(VIDEO);
    const row = page.locator('[data-upload]').nth(before);
    const id = await row.getAttribute('data-upload');
    await eventually('parts in flight', async () => (await row.locator('[data-part][data-state=sending]').count()) > 0);
    await row.locator('[data-role=cancel]').click();
    await eventually('cancelled', async () => (await row.getAttribute('data-phase')) === 'cancelled');
    for (const r of held) await r.abort().catch(() => {});
    await page.unroute(/partNumber=/, hold);
    await eventually('the upload aborted', async () => (await uploadState(id)).status === 'aborted');
    assert((await page.locator(`[data-pending="${id}"]`).count()) === 0, 'a cancelled upload is not offered for resume');
    await shot('cancelled');
  });

  await step('three files processing at once: at most 2 event streams, the others polled', async () => {
    let open = 0;
    let most = 0;
    const isEvents = (r) => /^\/operations\/[^/]+\/events$/.test(new URL(r.url()).pathname);
    const opened = (r) => { if (isEvents(r)) { open += 1; most = Math.max(most, open); } };
    const closed = (r) => { if (isEvents(r)) open -= 1; };
    page.on('request', opened);
    page.on('requestfinished', closed);
    page.on('requestfailed', closed);
    const before = await page.locator('[data-upload]').count();
    const bytes = readFileSync(VIDEO);
    await page.locator('#upload-files').setInputFiles(['a', 'b', 'c'].map((n) => ({ name: `${n}.mp4`, mimeType: 'video/mp4', buffer: bytes })));
    for (let i = 0; i < 3; i++) {
      const row = page.locator('[data-upload]').nth(before + i);
      await row.locator('[data-role=video-link]').waitFor({ timeout: 120_000 });
      assert((await row.getAttribute('data-phase')) === 'succeeded', `file ${i}: phase ${await row.getAttribute('data-phase')}`);
    }
    page.off('request', opened);
    page.off('requestfinished', closed);
    page.off('requestfailed', closed);
    assert(most <= 2, `at most 2 event streams at once (saw ${most})`);
  });

  assert(apiKeyRequests.length === 0, `the library sent the API key: ${apiKeyRequests}`);
  assert(errors.length === 0, `page errors: ${errors.join('; ')}`);
  console.log(`upload page: passed in ${((Date.now() - started) / 1000).toFixed(1)} s`);
} catch (e) {
  await shot('failure').catch(() => {});
  console.error(`page at failure: ${await page.locator('main').innerText().catch(() => '?')}\npage errors: ${errors.join('; ')}`);
  throw e;
} finally {
  await browser.close();
}
