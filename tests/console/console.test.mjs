// The web console (issue 9) in Debian's headless Chromium, driven with
// playwright-core, against the real api, transcoder, webhook-dispatcher and
// playback service that scripts/console-test.sh started. Every step asserts
// what the page shows and saves a screenshot to $CONSOLE_OUT. The video page
// (issue 19) plays the stream with hls.js: it plays, a forced switch to
// another rung plays that rung, a seek to the middle plays, and the browser's
// own HLS player plays it too where canPlayType says it can.
//
// Environment (set by scripts/console-test.sh):
//   CONSOLE_API_URL   http://127.0.0.1:<port> of the api
//   CONSOLE_PLAYBACK_URL  http://127.0.0.1:<port> of the playback service
//   CONSOLE_API_KEY   an API key of a fresh tenant
//   CONSOLE_VIDCTL    path of target/debug/vidctl
//   CONSOLE_VIDEO     the sample video to upload
//   CONSOLE_OUT       where screenshots go
//   CHROMIUM          the browser (default /usr/bin/chromium)
//
// It runs its own webhook receiver on 127.0.0.1 whose status code the test
// switches (500, then 200). Every request the browser makes to anything but
// loopback is aborted and fails the test.

import { execFile } from 'node:child_process';
import { createHash, createHmac, createSign, timingSafeEqual } from 'node:crypto';
import { mkdirSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import http from 'node:http';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { chromium } from 'playwright-core';

const env = (name, fallback) => {
  const v = process.env[name] ?? fallback;
  if (v === undefined) throw new Error(`${name} is not set (run scripts/console-test.sh)`);
  return v;
};
const API_URL = env('CONSOLE_API_URL');
const PLAYBACK_URL = env('CONSOLE_PLAYBACK_URL');
const API_KEY = env('CONSOLE_API_KEY');
const VIDCTL = env('CONSOLE_VIDCTL');
const VIDEO = env('CONSOLE_VIDEO');
const OUT = env('CONSOLE_OUT');
const CHROMIUM = env('CHROMIUM', '/usr/bin/chromium');
mkdirSync(OUT, { recursive: true });

const started = Date.now();
const secs = () => ((Date.now() - started) / 1000).toFixed(1);
function assert(cond, message) {
  if (!cond) throw new Error(`assertion failed: ${message}`);
}

// ------------------------------------------------------------- receiver --
/**
 * A loopback webhook receiver: `/hook` answers `receiver.status`, `/gone`
 * answers `receiver.goneStatus` (410 Gone disables an endpoint at once).
 * Records every request.
 */
const receiver = { status: 500, goneStatus: 410, requests: [] };
/** Markup an attacker controls (a response body, a description, a filename): it must show as text. */
const XSS = '<img src=x onerror=alert(1)></script><script>alert(1)</script>';
const server = http.createServer((req, res) => {
  const chunks = [];
  req.on('data', (c) => chunks.push(c));
  req.on('end', () => {
    const status = req.url === '/gone' ? receiver.goneStatus : receiver.status;
    receiver.requests.push({ path: req.url, headers: req.headers, body: Buffer.concat(chunks).toString('utf8'), answered: status });
    res.writeHead(status, { 'content-type': 'text/plain' });
    res.end(status >= 500 ? `receiver is failing on purpose ${XSS}` : 'ok');
  });
});
await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve));
const HOOK_URL = `http://127.0.0.1:${server.address().port}/hook`;
const GONE_URL = `http://127.0.0.1:${server.address().port}/gone`;

/** Checks a `Webhook-Signature: t=…,v1=…` header against a `whsec_` secret (HMAC key = decoded bytes). */
function signatureValid(secret, header, body) {
  const parts = header.split(',').map((p) => p.split('='));
  const t = parts.find(([k]) => k === 't')?.[1];
  const key = Buffer.from(secret.replace(/^whsec_/, ''), 'base64');
  const want = createHmac('sha256', key).update(`${t}.${body}`).digest();
  return parts.filter(([k]) => k === 'v1').some(([, v]) => {
    const got = Buffer.from(v, 'hex');
    return got.length === want.length && timingSafeEqual(got, want);
  });
}

// -------------------------------------------------------------- browser --
const browser = await chromium.launch({
  executablePath: CHROMIUM,
  headless: true,
  args: ['--no-sandbox', '--disable-gpu', '--disable-dev-shm-usage', '--disable-background-networking',
    '--disable-quic', '--disable-component-update', '--disable-sync', '--no-first-run', '--disable-default-apps'],
});
const context = await browser.newContext({ viewport: { width: 1280, height: 900 }, locale: 'en-GB', timezoneId: 'UTC' });
const blocked = [];
const LOOPBACK = new Set(['127.0.0.1', 'localhost', '[::1]']);
await context.route('**/*', (route) => {
  const url = new URL(route.request().url());
  if (LOOPBACK.has(url.hostname)) return route.continue();
  blocked.push(url.href);
  return route.abort('blockedbyclient');
});
const page = await context.newPage();
page.setDefaultTimeout(20_000);
const pageErrors = [];
page.on('pageerror', (e) => pageErrors.push(`pageerror: ${e.message}`));
page.on('dialog', (d) => { pageErrors.push(`dialog (script ran): ${d.message()}`); d.dismiss().catch(() => {}); });
page.on('console', (m) => {
  if (m.type() === 'error' && !/status of 4\d\d/.test(m.text())) pageErrors.push(`console: ${m.text()}`);
});
const requests = [];
/** Requests to the playback service, and whether each carried an Authorization header (none may). */
const playbackRequests = [];
page.on('request', (r) => {
  requests.push(`${r.method()} ${r.url()}`);
  if (r.url().startsWith(`${PLAYBACK_URL}/`)) playbackRequests.push({ url: r.url(), authorization: 'authorization' in r.headers() });
});

let shot = 0;
async function screenshot(name) {
  shot += 1;
  const path = join(OUT, `${String(shot).padStart(2, '0')}-${name}.png`);
  await page.screenshot({ path, fullPage: true });
  console.log(`    screenshot ${path}`);
}

async function step(name, fn) {
  const t = Date.now();
  console.log(`[${secs()} s] ${name}`);
  await fn();
  console.log(`    ok (${((Date.now() - t) / 1000).toFixed(1)} s)`);
}

/** Waits until `fn()` is truthy (polling), or fails with `what`. */
async function eventually(what, fn, timeoutMs = 60_000, everyMs = 250) {
  const deadline = Date.now() + timeoutMs;
  let last;
  for (;;) {
    try {
      last = await fn();
      if (last) return last;
    } catch (e) {
      if (e.fatal) throw e;
      last = e;
    }
    if (Date.now() > deadline) throw new Error(`timed out after ${timeoutMs / 1000} s waiting for ${what} (last: ${last})`);
    await new Promise((r) => setTimeout(r, everyMs));
  }
}

const heading = () => page.locator('main h1');
/** Fails if markup from the api became elements (an XSS payload must stay text). */
async function noInjectedMarkup(where) {
  const injected = await page.evaluate(() => document.querySelectorAll('main img[src="x"], main script, [onerror], [onload]').length);
  assert(injected === 0, `${where}: api text was rendered as markup (${injected} elements)`);
}
/** Fails if the page is wider than the window (a long unbroken string must wrap). */
async function noSidewaysScroll(where) {
  const [scroll, inner] = await page.evaluate(() => [document.documentElement.scrollWidth, window.innerWidth]);
  assert(scroll <= inner, `${where}: the page is ${scroll} px wide in a ${inner} px window`);
}
/**
 * Plays `video` (a locator; muted, which autoplay policy always allows) and
 * resolves on the `timeupdate` that shows its currentTime `seconds` past where
 * it started, then pauses it (the sample is short: the play head must not
 * reach the end while screenshots are taken). Fails on a media error, on a
 * refused play(), or if the time has not advanced within `timeoutMs`.
 */
async function playsFor(video, seconds, what, timeoutMs = 30_000) {
  const r = await video.evaluate((v, [seconds, timeoutMs]) => new Promise((resolve) => {
    const from = v.currentTime;
    const done = (result) => {
      clearTimeout(timer);
      v.removeEventListener('timeupdate', tick);
      v.removeEventListener('error', failed);
      v.pause();
      resolve({ ...result, from, to: v.currentTime });
    };
    const tick = () => { if (v.currentTime >= from + seconds) done({ ok: true }); };
    const failed = () => done({ ok: false, error: `MediaError ${v.error && v.error.code} ${v.error && v.error.message}` });
    const timer = setTimeout(() => done({ ok: false, error: `no progress in ${timeoutMs} ms (readyState ${v.readyState}, paused ${v.paused}, ended ${v.ended})` }), timeoutMs);
    v.addEventListener('timeupdate', tick);
    v.addEventListener('error', failed);
    if (v.error) return failed();
    v.muted = true;
    v.play().catch((e) => done({ ok: false, error: `play() refused: ${e.name} ${e.message}` }));
  }), [seconds, timeoutMs]);
  assert(r.ok, `${what}: ${r.error} (currentTime ${r.from.toFixed(2)} → ${r.to.toFixed(2)})`);
  console.log(`    ${what}: currentTime ${r.from.toFixed(2)} → ${r.to.toFixed(2)} s`);
  return r;
}
/** Fails if a player shows an error (a fatal hls.js error or a MediaError). */
async function noPlayerError(figure, what) {
  const state = await figure.getAttribute('data-state');
  const error = await figure.locator('video').evaluate((v) => v.error && `MediaError ${v.error.code} ${v.error.message}`);
  assert(state !== 'error' && !error, `${what}: ${error || (await figure.innerText())}`);
}
/** The `data-key` of the focused element (keyboard focus must not fall back to <body>). */
const focused = () => page.evaluate(() => document.activeElement?.dataset?.key || document.activeElement?.tagName);
/** A link of the main navigation. */
const nav = (name) => page.getByRole('navigation', { name: 'Main' }).getByRole('link', { name, exact: true });
let endpointId;
let goneEndpointId;
let secret;
let operationId;
let videoId;
let cancelledVideoId;
let deliveryId;
let eventId;
let linkDir;
const FILENAME = '<img src=x onerror=alert(1)> ünï 😀';

try {
  await step('the console is served with a Content-Security-Policy and no inline script', async () => {
    const resp = await fetch(`${API_URL}/console/`);
    assert(resp.status === 200, `GET /console/ answered ${resp.status}`);
    const csp = resp.headers.get('content-security-policy') || '';
    assert(csp.includes("script-src 'self'") && !csp.includes('unsafe-inline'), `CSP: ${csp}`);
    assert(csp.includes("require-trusted-types-for 'script'") && csp.includes("trusted-types 'none'"), `CSP enforces Trusted Types: ${csp}`);
    // Issue 19: what hls.js needs and nothing more. XHR to the playback
    // service; media from a blob: (MediaSource) and the playback service
    // (native HLS); no worker, no eval.
    const directive = (name) => (csp.split(';').map((d) => d.trim().split(/\s+/)).find(([n]) => n === name) || []).slice(1);
    assert(directive('default-src').join(' ') === "'none'", `default-src 'none': ${csp}`);
    // …and the storage origin, for the upload page's part PUTs (issue 21).
    const connect = directive('connect-src');
    assert(connect[0] === "'self'" && connect[1] === PLAYBACK_URL && connect.length === 3 && /^https?:\/\/[^/]+$/.test(connect[2]),
      `connect-src is this origin, the playback service and storage: ${csp}`);
    const media = directive('media-src');
    assert(media.includes('blob:') && media.includes(PLAYBACK_URL) && media.includes("'self'"), `media-src has blob: and the playback service: ${csp}`);
    // img-src opens for the playback service's storyboard sheet (issue 20), never for blob:.
    assert(!directive('img-src').includes('blob:') && directive('img-src').includes(PLAYBACK_URL), `img-src: the playback service, no blob: ${csp}`);
    assert(directive('worker-src').length === 0 && !csp.includes('unsafe-eval'), `no worker, no eval: ${csp}`);
    // hls.js is served from the binary, exactly the committed (npm-checked) file.
    const hlsResp = await fetch(`${API_URL}/console/vendor/hls.min.mjs`);
    assert(hlsResp.status === 200 && /^text\/javascript/.test(hlsResp.headers.get('content-type')), `hls.min.mjs: ${hlsResp.status} ${hlsResp.headers.get('content-type')}`);
    const served = createHash('sha256').update(Buffer.from(await hlsResp.arrayBuffer())).digest('hex');
    const committed = createHash('sha256').update(readFileSync(new URL('../../services/api/console/vendor/hls.min.mjs', import.meta.url))).digest('hex');
    assert(served === committed, `the served hls.min.mjs is the committed one (${served} vs ${committed})`);
    assert((await fetch(`${API_URL}/console/vendor/LICENSE.hls.js`)).status === 200, 'the hls.js licence is served beside it');
    assert((await fetch(`${API_URL}/console/vendor/package.json`)).status === 404, 'the npm manifest is not served');
    const html = await resp.text();
    assert(!/<script(?![^>]*\bsrc=)[^>]*>/i.test(html), 'index.html has an inline script');
    const redirect = await fetch(`${API_URL}/console`, { redirect: 'manual' });
    assert(redirect.status === 308 && redirect.headers.get('location') === '/console/', `GET /console: ${redirect.status}`);
  });

  await step('1. sign in (a wrong key shows the problem; the right one is kept for the session only)', async () => {
    await page.goto(`${API_URL}/console`);
    await heading().filter({ hasText: 'Sign in' }).waitFor();
    await page.getByLabel('API key').fill('vidk_not_a_real_key');
    await page.getByRole('button', { name: 'Sign in' }).click();
    const problem = page.locator('main .problem');
    await problem.waitFor();
    const text = await problem.innerText();
    assert(/Unauthorized/.test(text) && /API key/i.test(text), `the 401 problem shows title and detail: ${text}`);
    await screenshot('sign-in-refused');
    // A key that cannot be sent as a header is refused as such, not as a "network error".
    await page.getByLabel('API key').fill('vidk_ünïcødé 😀');
    await page.getByRole('button', { name: 'Sign in' }).click();
    await page.locator('main .problem').filter({ hasText: 'Not an API key' }).waitFor();
    await page.getByLabel('API key').fill(API_KEY);
    await page.getByRole('button', { name: 'Sign in' }).click();
    await heading().filter({ hasText: 'Endpoints' }).waitFor();
    assert(await page.getByRole('navigation', { name: 'Main' }).isVisible(), 'navigation is shown');
    const html = await page.content();
    assert(!html.includes(API_KEY), 'the API key is never displayed again');
    const stored = await page.evaluate(() => ({ session: JSON.stringify(sessionStorage), local: JSON.stringify(localStorage) }));
    assert(stored.session.includes(API_KEY), 'the key is in sessionStorage');
    assert(!stored.local.includes(API_KEY), 'the key is not in localStorage');
    assert(!document_cookie_has_key(await context.cookies()), 'the key is not in a cookie');
    await screenshot('endpoints-empty');
  });

  await step('2. create an endpoint pointing at a loopback receiver that fails (500); the secret is shown once', async () => {
    await page.getByLabel('Endpoint URL').fill(HOOK_URL);
    // A description with markup and a long unbroken word: shown as text, wrapped.
    await page.getByLabel('Description (optional)').fill(`console test receiver ${XSS} ${'x'.repeat(400)}`);
    await page.getByRole('button', { name: 'Create endpoint' }).click();
    const panel = page.getByTestId('secret-panel');
    await panel.waitFor();
    secret = (await panel.locator('code.secret').innerText()).trim();
    assert(/^whsec_[A-Za-z0-9+/=]{32,}$/.test(secret), `a whsec_ secret is shown: ${secret}`);
    assert(/shown only this once/.test(await panel.innerText()), 'the panel says the secret is shown once');
    const row = page.locator('tr[data-endpoint-id]').filter({ hasText: HOOK_URL });
    await row.waitFor();
    endpointId = await row.getAttribute('data-endpoint-id');
    assert(/^ep_/.test(endpointId), `endpoint id ${endpointId}`);
    assert((await row.locator('[data-status]').innerText()) === 'enabled', 'the new endpoint is enabled');
    assert(/no attempts yet/.test(await row.innerText()), 'no delivery yet');
    assert((await row.innerText()).includes(XSS), 'the description is shown as text');
    await noInjectedMarkup('endpoints');
    await noSidewaysScroll('endpoints');
    await screenshot('endpoint-created-secret-once');
    await panel.getByRole('button', { name: 'Done' }).click();
    await page.reload();
    await heading().filter({ hasText: 'Endpoints' }).waitFor();
    await page.locator(`tr[data-endpoint-id="${endpointId}"]`).waitFor();
    assert(!(await page.content()).includes(secret), 'the secret is not shown again');
    // A second endpoint, answering 410 Gone, for the disable/enable step.
    await page.getByLabel('Endpoint URL').fill(GONE_URL);
    await page.getByRole('button', { name: 'Create endpoint' }).click();
    const gone = page.locator('tr[data-endpoint-id]').filter({ hasText: GONE_URL });
    await gone.waitFor();
    goneEndpointId = await gone.getAttribute('data-endpoint-id');
    await page.getByTestId('secret-panel').getByRole('button', { name: 'Done' }).click();
  });

  await step('3. upload a sample video with vidctl (under a filename with markup)', async () => {
    linkDir = mkdtempSync(join(tmpdir(), 'vid-console-'));
    const hostile = join(linkDir, `${FILENAME}.mp4`);
    // The sample looped three times (no re-encoding; ~16 s, four 4 s
    // segments): the player steps play, switch at a segment boundary and seek
    // to the middle without reaching the end of a 5 s clip.
    await promisify(execFile)('ffmpeg', ['-hide_banner', '-loglevel', 'error', '-y', '-stream_loop', '2', '-i', VIDEO, '-c', 'copy', hostile]);
    const { stdout } = await promisify(execFile)(VIDCTL, ['--json', 'upload', hostile], {
      env: { ...process.env, VIDCTL_API_URL: API_URL, VIDCTL_API_KEY: API_KEY },
      timeout: 120_000,
    });
    const report = JSON.parse(stdout);
    operationId = report.operation_id;
    videoId = report.video_id;
    assert(/^op_/.test(operationId) && /^vid_/.test(videoId), `vidctl answered ${stdout}`);
    console.log(`    operation ${operationId}, video ${videoId}`);
  });

  await step('4. the Operations page follows the operation live until it succeeds', async () => {
    await nav('Operations').click();
    await heading().filter({ hasText: 'Operations' }).waitFor();
    const row = page.locator(`tr[data-operation-id="${operationId}"]`);
    await row.waitFor();
    const seen = [];
    let midShot = false;
    await eventually('the operation to show succeeded', async () => {
      const status = await row.getAttribute('data-operation-status');
      const progress = Number(await row.locator('progress').getAttribute('value'));
      const label = `${status} ${progress}%`;
      if (seen[seen.length - 1] !== label) seen.push(label);
      if (status === 'failed' || status === 'cancelled') {
        throw Object.assign(new Error(`the operation ended ${status}: ${await row.innerText()}`), { fatal: true });
      }
      if (!midShot && status === 'running') {
        midShot = true;
        await screenshot('operation-running');
      }
      return status === 'succeeded';
    }, 240_000, 200);
    console.log(`    states seen without reloading: ${seen.join(' → ')}`);
    assert((await row.locator('progress').getAttribute('value')) === '100', 'the progress bar is full');
    assert((await row.innerText()).includes('100%'), 'the row says 100%');
    assert(await row.getByRole('button', { name: /Cancel/ }).count() === 0, 'no Cancel on a terminal operation');
    const streamed = requests.some((r) => r.includes(`/operations/${operationId}/events`));
    const wasLive = seen.length > 1 || streamed;
    assert(wasLive, `the page updated while the operation ran (seen ${seen}, SSE ${streamed})`);
    console.log(`    followed over Server-Sent Events: ${streamed}`);
    await screenshot('operations-succeeded');
  });

  await step('the Video page shows the source metadata, the poster, the playback URLs and the MP4 downloads', async () => {
    await page.locator(`tr[data-operation-id="${operationId}"]`).getByRole('link', { name: videoId }).click();
    await page.getByTestId('source-metadata').waitFor();
    assert((await heading().innerText()) === `${FILENAME}.mp4`, `the filename is the heading, as text: ${await heading().innerText()}`);
    await noInjectedMarkup('video');
    const meta = await page.getByTestId('source-metadata').innerText();
    assert(/h264/i.test(meta) && /×/.test(meta), `source metadata: ${meta}`);
    const poster = page.locator('figure.poster img');
    await eventually('the poster to load', () => poster.evaluate((img) => img.complete && img.naturalWidth > 0), 20_000);
    // The playback IDs, each with its HLS and DASH URL as text (and a link).
    const video = await (await fetch(`${API_URL}/videos/${videoId}`, { headers: { Authorization: `Bearer ${API_KEY}` } })).json();
    assert(Array.isArray(video.playback_ids) && video.playback_ids.length >= 1, `the ready video has a playback ID: ${JSON.stringify(video.playback_ids)}`);
    for (const pb of video.playback_ids) {
      const row = page.locator(`tr[data-playback-id="${pb.id}"]`);
      assert((await row.locator('[data-url="hls"] a').innerText()) === pb.hls_url, `the hls_url is shown: ${pb.hls_url}`);
      assert((await row.locator('[data-url="dash"] a').innerText()) === pb.dash_url, `the dash_url is shown: ${pb.dash_url}`);
      assert(pb.hls_url.startsWith(`${PLAYBACK_URL}/play/`), `the hls_url is on the playback service: ${pb.hls_url}`);
    }
    // Static renditions are downloads now, not players: each link answers an MP4.
    const downloads = page.locator('tr[data-rendition] a[download]');
    const n = await downloads.count();
    assert(n >= 1 && n === video.renditions.length, `one download per static rendition (${n} of ${video.renditions.length})`);
    assert(await page.locator('tr[data-rendition] video').count() === 0, 'no <video> per rendition any more');
    const href = await downloads.first().getAttribute('href');
    const head = await fetch(href, { headers: { Range: 'bytes=0-11' } });
    const bytes = Buffer.from(await head.arrayBuffer());
    assert((head.status === 206 || head.status === 200) && bytes.subarray(4, 8).toString('latin1') === 'ftyp', `the download link answers an MP4 (${head.status}, ${bytes.subarray(0, 12).toString('hex')})`);
    console.log(`    ${video.playback_ids.length} playback ID(s), ${n} MP4 downloads`);
  });

  await step('the stream plays with hls.js (currentTime advances, no media error), the rung playing is shown', async () => {
    const figure = page.getByTestId('hls-player');
    const video = figure.locator('video');
    await eventually('hls.js to parse the master playlist', async () => {
      await noPlayerError(figure, 'the hls.js player');
      return (await figure.getAttribute('data-state')) === 'ready';
    }, 30_000);
    const levels = Number(await figure.getAttribute('data-levels'));
    assert(levels >= 2, `the master playlist lists several rungs (${levels})`);
    const options = await page.getByLabel('Rung').locator('option').allTextContents();
    assert(options.length === levels + 1 && /^Auto/.test(options[0]) && options.slice(1).every((o) => /\d+ × \d+ · \d+\.\d\d Mb\/s$/.test(o)), `the picker lists Auto and every rung: ${options}`);
    await playsFor(video, 1.0, 'hls.js playback');
    await noPlayerError(figure, 'the hls.js player after playing');
    const playing = await page.getByTestId('rung-playing').innerText();
    assert(/\d+ × \d+/.test(playing) && /\(Auto\)/.test(playing), `the rung playing is shown: ${playing}`);
    assert(await video.evaluate((v) => v.src.startsWith('blob:')), 'hls.js plays through a MediaSource (a blob: URL)');
    const kinds = new Set(playbackRequests.map((r) => r.url.replace(/^.*\.([a-z0-9]+)$/, '$1')));
    assert(kinds.has('m3u8') && kinds.has('mp4') && kinds.has('m4s'), `playlists, init and media segments came from the playback service: ${[...kinds]}`);
    assert(playbackRequests.every((r) => !r.authorization), 'no playback request carries the API key');
    console.log(`    ${levels} rungs; playing ${playing}; ${playbackRequests.length} requests to the playback service`);
    await screenshot('video-stream-playing');
  });

  await step('a forced switch to another rung plays that rung', async () => {
    const figure = page.getByTestId('hls-player');
    const video = figure.locator('video');
    const before = Number(await figure.getAttribute('data-level'));
    const levels = Number(await figure.getAttribute('data-levels'));
    const target = before === 0 ? levels - 1 : 0;
    const option = page.getByLabel('Rung').locator(`option[value="${target}"]`);
    const height = Number(await option.getAttribute('data-height'));
    const heightBefore = await video.evaluate((v) => v.videoHeight);
    assert(height > 0 && height !== heightBefore, `the target rung has another height (${height} vs ${heightBefore})`);
    await page.getByLabel('Rung').selectOption(String(target));
    // The switch lands when hls.js reports that the fragment at the play head
    // is from the picked level and the decoder shows that rung's frames
    // (`videoHeight`); both only happen while it plays, so it plays meanwhile.
    await video.evaluate((v) => { v.muted = true; return v.play(); });
    await eventually(`the player to switch from level ${before} to ${target}`, async () => {
      await noPlayerError(figure, 'the hls.js player while switching');
      const [level, shown, ended] = [Number(await figure.getAttribute('data-level')), ...await video.evaluate((v) => [v.videoHeight, v.ended])];
      if (ended) throw Object.assign(new Error(`the video ended before the switch (level ${level}, ${shown} p)`), { fatal: true });
      return level === target && shown === height;
    }, 45_000, 100);
    await playsFor(video, 1.0, 'playback on the new rung');
    assert(Number(await figure.getAttribute('data-level')) === target, 'it stays on the picked rung');
    assert(await figure.getAttribute('data-auto') === 'false', 'Auto is off after picking a rung');
    const playing = await page.getByTestId('rung-playing').innerText();
    assert(playing.includes(`× ${height}`) && !/Auto/.test(playing), `the page shows the picked rung: ${playing}`);
    await noPlayerError(figure, 'the hls.js player after the switch');
    console.log(`    level ${before} (${heightBefore} p) → ${target} (${height} p): ${playing}`);
    await screenshot('video-stream-switched');
  });

  await step('a seek to the middle plays', async () => {
    const figure = page.getByTestId('hls-player');
    const video = figure.locator('video');
    const r = await video.evaluate((v) => new Promise((resolve) => {
      const mid = v.duration / 2;
      const timer = setTimeout(() => resolve({ ok: false, mid, error: `no seeked in 20 s (readyState ${v.readyState})` }), 20_000);
      v.addEventListener('seeked', () => { clearTimeout(timer); resolve({ ok: true, mid, at: v.currentTime }); }, { once: true });
      v.currentTime = mid;
    }));
    assert(r.ok && Math.abs(r.at - r.mid) < 0.5, `the seek to ${r.mid} s lands: ${JSON.stringify(r)}`);
    await playsFor(video, 1.0, `playback after the seek to ${r.mid.toFixed(2)} s`);
    await noPlayerError(figure, 'the hls.js player after the seek');
    await screenshot('video-stream-seeked');
  });

  await step('a signed playback ID plays with hls.js from one token URL, every request carrying the token (issue 20)', async () => {
    const api = (method, path, body) => fetch(`${API_URL}${path}`, {
      method, headers: { Authorization: `Bearer ${API_KEY}`, ...(body ? { 'Content-Type': 'application/json' } : {}) }, body: body && JSON.stringify(body),
    }).then(async (r) => { assert(r.status === 201, `${method} ${path}: ${r.status}`); return r.json(); });
    const key = await api('POST', '/signing-keys');
    const signed = await api('POST', `/videos/${videoId}/playback-ids`, { policy: 'signed' });
    // The token, minted with node's own crypto (RS256 = RSASSA-PKCS1-v1_5 with SHA-256, RFC 7518 §3.3).
    const b64 = (v) => Buffer.from(JSON.stringify(v)).toString('base64url');
    const input = `${b64({ alg: 'RS256', typ: 'JWT', kid: key.id })}.${b64({ sub: signed.id, aud: 'v', exp: Math.floor(Date.now() / 1000) + 600 })}`;
    const token = `${input}.${createSign('RSA-SHA256').update(input).sign(key.private_key).toString('base64url')}`;
    assert((await fetch(signed.hls_url)).status === 403, 'the signed ID refuses a request without a token');
    const url = `${signed.hls_url}?token=${token}`;
    const seen = playbackRequests.length;
    const r = await page.evaluate(async (src) => {
      const { default: Hls } = await import('/console/vendor/hls.min.mjs');
      const v = document.createElement('video');
      v.muted = true;
      v.dataset.testid = 'signed-player';
      document.body.append(v);
      const hls = new Hls();
      const result = await new Promise((resolve) => {
        const timer = setTimeout(() => resolve({ ok: false, error: `no progress in 30 s (readyState ${v.readyState})` }), 30_000);
        hls.on(Hls.Events.ERROR, (_, d) => { if (d.fatal) { clearTimeout(timer); resolve({ ok: false, error: `${d.type}/${d.details}` }); } });
        hls.on(Hls.Events.MANIFEST_PARSED, () => v.play());
        v.addEventListener('timeupdate', () => { if (v.currentTime >= 1) { clearTimeout(timer); resolve({ ok: true }); } });
        hls.loadSource(src);
        hls.attachMedia(v);
      });
      const at = v.currentTime;
      hls.destroy();
      v.remove();
      return { ...result, at };
    }, url);
    assert(r.ok, `the signed stream plays: ${r.error} (currentTime ${r.at})`);
    const mine = playbackRequests.slice(seen).filter((q) => q.url.includes(`/play/${signed.id}`));
    const kinds = new Set(mine.map((q) => new URL(q.url).pathname.replace(/^.*\.([a-z0-9]+)$/, '$1')));
    assert(kinds.has('m3u8') && kinds.has('mp4') && kinds.has('m4s'), `playlists, init and media segments of the signed ID were fetched: ${[...kinds]}`);
    const without = mine.filter((q) => new URL(q.url).searchParams.get('token') !== token || [...new URL(q.url).searchParams.keys()].length !== 1);
    assert(without.length === 0, `every request of the signed ID carried exactly the token: ${without.map((q) => q.url).join(', ')}`);
    console.log(`    currentTime ${r.at.toFixed(2)} s; ${mine.length} requests, each with ?token=`);
  });

  await step('hovering the seek strip shows the storyboard tile of that time (issue 20)', async () => {
    const figure = page.getByTestId('hls-player');
    const strip = figure.getByTestId('scrub');
    await eventually('the seek strip (storyboard.json loaded)', async () => strip.isVisible());
    const hlsUrl = await figure.locator('video').evaluate(() => document.querySelector('[data-testid="hls-url"], a[href$=".m3u8"]')?.href || null);
    const box = await strip.boundingBox();
    await page.mouse.move(box.x + box.width * 0.75, box.y + box.height / 2);
    const preview = figure.getByTestId('storyboard-preview');
    await eventually('the tile preview', async () => preview.isVisible());
    const shown = await preview.evaluate((el) => ({ time: Number(el.dataset.time), tile: Number(el.dataset.tile), position: el.style.backgroundPosition, image: el.style.backgroundImage }));
    const sheetUrl = shown.image.replace(/^url\("?/, '').replace(/"?\)$/, '');
    const jsonUrl = sheetUrl.replace(/storyboard\.jpg(\?.*)?$/, 'storyboard.json$1');
    const board = await page.evaluate(async (u) => (await fetch(u)).json(), jsonUrl);
    const duration = await figure.locator('video').evaluate((v) => v.duration);
    assert(Math.abs(shown.time - 0.75 * duration) < 0.05 * duration, `the pointer's time: ${JSON.stringify(shown)} of ${duration} s (${hlsUrl})`);
    let expected = 0;
    board.tiles.forEach((t, i) => { if (t.start <= shown.time) expected = i; });
    assert(shown.tile === expected, `tile ${shown.tile} shown at ${shown.time} s, the storyboard says ${expected}: ${JSON.stringify(board.tiles)}`);
    const tile = board.tiles[expected];
    assert(shown.position === `-${tile.x}px -${tile.y}px`, `the sheet is cropped to the tile: ${shown.position} vs ${tile.x},${tile.y}`);
    const loaded = await page.evaluate((src) => new Promise((resolve) => {
      const img = new Image();
      img.onload = () => resolve(img.naturalWidth);
      img.onerror = () => resolve(0);
      img.src = src;
    }), sheetUrl);
    assert(loaded >= board.tile_width, `the sheet loads under the CSP (img-src): width ${loaded}`);
    await screenshot('video-storyboard-hover');
  });

  await step('native HLS: where canPlayType says yes, the browser\'s own player plays the same URL', async () => {
    const support = await page.evaluate(() => document.createElement('video').canPlayType('application/vnd.apple.mpegurl'));
    console.log(`    canPlayType('application/vnd.apple.mpegurl') = '${support}'`);
    const figure = page.getByTestId('native-player');
    if (!support) {
      assert(await figure.count() === 0, 'no native player where the browser has no HLS');
      await page.getByText('does not play HLS natively').waitFor();
      return;
    }
    const video = figure.locator('video');
    const src = await video.getAttribute('src');
    assert(src.startsWith(`${PLAYBACK_URL}/play/`) && src.endsWith('.m3u8'), `the native player plays the hls_url itself: ${src}`);
    await eventually('the native player to load the stream', async () => {
      await noPlayerError(figure, 'the native HLS player');
      return (await figure.getAttribute('data-state')) === 'ready';
    }, 30_000);
    await playsFor(video, 1.0, 'native HLS playback');
    await noPlayerError(figure, 'the native HLS player after playing');
    await figure.scrollIntoViewIfNeeded();
    await screenshot('video-native-hls');
  });

  await step('5. the endpoint shows the failed delivery with its status code 500', async () => {
    await nav('Endpoints').click();
    await heading().filter({ hasText: 'Endpoints' }).waitFor();
    await page.locator(`tr[data-endpoint-id="${endpointId}"]`).getByRole('link', { name: HOOK_URL }).click();
    await heading().filter({ hasText: HOOK_URL }).waitFor();
    const ready = page.locator('tr[data-delivery-id]').filter({ hasText: 'video.ready' });
    await eventually('the video.ready delivery to be failed', async () => (await ready.getAttribute('data-delivery-status')) === 'failed', 90_000);
    deliveryId = await ready.getAttribute('data-delivery-id');
    eventId = (await ready.locator('a.mono').innerText()).trim();
    assert((await ready.locator('[data-http-status]').innerText()) === 'HTTP 500', 'its last result is HTTP 500');
    const ids = await page.locator('tr[data-delivery-id]').evaluateAll((rs) => rs.map((r) => r.dataset.deliveryId));
    assert(ids.length >= 2 && ids.every((id, i) => i === 0 || ids[i - 1] > id), `newest first: ${ids}`);
    await ready.getByRole('button', { name: /attempts of delivery/ }).click();
    const attempts = page.locator(`#attempts-${deliveryId} tr[data-attempt]`);
    const count = await attempts.count();
    assert(count >= 2, `several attempts are listed (${count})`);
    const first = await attempts.first().innerText();
    assert(/HTTP 500/.test(first) && /receiver is failing on purpose/.test(first) && /\d+ ms/.test(first), `an attempt shows status, snippet and duration: ${first}`);
    assert((await attempts.first().locator('pre').innerText()).includes(XSS), 'the response snippet with markup is shown as text');
    await noInjectedMarkup('endpoint detail');
    await noSidewaysScroll('endpoint detail');
    await screenshot('endpoint-failed-delivery');
    // Filters: by status and by event type.
    await page.getByLabel('Event type').selectOption('video.processing');
    await eventually('the event type filter', async () => {
      const types = await page.locator('tr[data-delivery-id] td:nth-child(2) div').allInnerTexts();
      return types.length > 0 && types.every((t) => t === 'video.processing');
    }, 10_000);
    await page.getByLabel('Event type').selectOption('');
    await page.getByLabel('Status').selectOption('succeeded');
    await page.getByText('No deliveries match.').waitFor();
    await page.getByLabel('Status').selectOption('failed');
    await eventually('the status filter', async () => (await page.locator('tr[data-delivery-id]').count()) >= 1
      && (await page.locator('tr[data-delivery-id]').evaluateAll((rs) => rs.every((r) => r.dataset.deliveryStatus === 'failed'))), 10_000);
    await page.getByLabel('Status').selectOption('');
  });

  await step('6. make the receiver succeed, press Resend, and see the delivery succeed', async () => {
    receiver.status = 200;
    const before = receiver.requests.length;
    const row = page.locator(`tr[data-delivery-id="${deliveryId}"]`);
    // By keyboard: focus stays on Resend although the list re-renders.
    await row.getByRole('button', { name: 'Resend' }).focus();
    await page.keyboard.press('Enter');
    await page.getByRole('status').filter({ hasText: 'will be sent again' }).waitFor();
    await eventually('keyboard focus to stay on Resend', async () => (await focused()) === `resend:${deliveryId}`, 5_000);
    await eventually('the resent delivery to show succeeded', async () => (await row.getAttribute('data-delivery-status')) === 'succeeded', 60_000);
    assert((await row.locator('[data-http-status]').innerText()) === 'HTTP 200', 'its last result is HTTP 200');
    const got = receiver.requests.slice(before).find((r) => r.answered === 200);
    assert(got, 'the receiver got the resent delivery');
    assert(got.headers['webhook-id'] === eventId, `same event id: ${got.headers['webhook-id']} vs ${eventId}`);
    assert(signatureValid(secret, got.headers['webhook-signature'], got.body), 'the signature verifies with the secret shown at creation');
    const attempts = page.locator(`#attempts-${deliveryId} tr[data-attempt]`);
    assert(/HTTP 200/.test(await attempts.last().innerText()), 'the new attempt is listed with HTTP 200');
    await screenshot('endpoint-resent-succeeded');
  });

  await step('the Endpoints list shows the success rate and last attempt; rotate shows a new secret once', async () => {
    await nav('Endpoints').click();
    const row = page.locator(`tr[data-endpoint-id="${endpointId}"]`);
    await row.waitFor();
    const rate = await row.getByTestId('success-rate').innerText();
    assert(/^\d+%/.test(rate) && /1 of \d+/.test(rate), `success rate: ${rate}`);
    assert((await row.locator('[data-http-status]').innerText()) === 'HTTP 200', 'last attempt HTTP 200');
    await row.getByRole('button', { name: /Rotate the secret/ }).click();
    const panel = page.getByTestId('secret-panel');
    await panel.waitFor();
    const rotated = (await panel.locator('code.secret').innerText()).trim();
    assert(/^whsec_/.test(rotated) && rotated !== secret, 'a new secret is shown');
    await screenshot('endpoints-health-rotated');
  });

  await step('an endpoint that answered 410 is shown disabled with its reason; Enable delivers its paused backlog', async () => {
    const row = page.locator(`tr[data-endpoint-id="${goneEndpointId}"]`);
    await eventually('the 410 endpoint to show disabled', async () => {
      await nav('Endpoints').click();
      await heading().filter({ hasText: 'Endpoints' }).waitFor();
      await row.waitFor();
      return (await row.locator('[data-status]').innerText()) === 'disabled';
    }, 60_000, 1000);
    const text = await row.innerText();
    assert(/410/.test(text), `the reason is shown: ${text}`);
    assert((await row.locator('[data-http-status]').innerText()) === 'HTTP 410', 'last attempt HTTP 410');
    await screenshot('endpoint-disabled');
    receiver.goneStatus = 200;
    await row.getByRole('button', { name: /^Enable/ }).click();
    await page.getByRole('status').filter({ hasText: 'is enabled' }).waitFor();
    await eventually('the endpoint to show enabled', async () => (await row.locator('[data-status]').innerText()) === 'enabled', 10_000);
    assert(await row.getByRole('button', { name: /^Enable/ }).count() === 0, 'no Enable button on an enabled endpoint');
    await row.getByRole('link', { name: GONE_URL }).click();
    const ready = page.locator('tr[data-delivery-id]').filter({ hasText: 'video.ready' });
    await eventually('the paused video.ready delivery to succeed after enabling', async () => (await ready.getAttribute('data-delivery-status')) === 'succeeded', 60_000);
    await screenshot('endpoint-enabled-backlog-delivered');
  });

  await step('the Events page lists the events with their resource and payload', async () => {
    await nav('Events').click();
    await heading().filter({ hasText: 'Events' }).waitFor();
    const row = page.locator(`tr[data-event-id="${eventId}"]`);
    await row.waitFor();
    assert((await row.innerText()).includes('video.ready') && (await row.innerText()).includes(videoId), 'type and resource shown');
    assert(await page.locator('tr[data-event-id]').filter({ hasText: 'video.processing' }).count() === 1, 'video.processing listed');
    const disabled = page.locator('tr[data-event-id]').filter({ hasText: 'webhook_endpoint.disabled' });
    assert((await disabled.innerText()).includes(goneEndpointId), 'the disabled event names its endpoint');
    await row.getByRole('button', { name: 'Show payload' }).click();
    const payload = JSON.parse(await page.locator(`#payload-${eventId} pre`).innerText());
    assert(payload.id === eventId && payload.type === 'video.ready' && payload.data.video_id === videoId, 'the payload');
    await screenshot('events');
  });

  await step('Cancel stops an operation that is not terminal', async () => {
    // A longer clip (the sample looped, no re-encoding) so the transcode is still going when Cancel is pressed.
    const long = join(OUT, 'long.mp4');
    await promisify(execFile)('ffmpeg', ['-hide_banner', '-loglevel', 'error', '-y', '-stream_loop', '11', '-i', VIDEO, '-c', 'copy', long]);
    const { stdout } = await promisify(execFile)(VIDCTL, ['--json', 'upload', long], {
      env: { ...process.env, VIDCTL_API_URL: API_URL, VIDCTL_API_KEY: API_KEY },
      timeout: 120_000,
    });
    rmSync(long, { force: true });
    const op = JSON.parse(stdout).operation_id;
    cancelledVideoId = JSON.parse(stdout).video_id;
    await nav('Operations').click();
    const row = page.locator(`tr[data-operation-id="${op}"]`);
    await row.waitFor();
    const status = await row.getAttribute('data-operation-status');
    assert(status === 'pending' || status === 'running', `the operation is still going (${status})`);
    // Focus on Cancel survives the live progress updates that re-render the row.
    await row.getByRole('button', { name: `Cancel operation ${op}` }).focus();
    await page.waitForTimeout(1500);
    assert(await focused() === `cancel:${op}`, `keyboard focus stays on Cancel while the row updates (on ${await focused()})`);
    await page.keyboard.press('Enter');
    await eventually('the operation to show cancelled', async () => (await row.getAttribute('data-operation-status')) === 'cancelled', 30_000);
    assert(await row.getByRole('button', { name: /Cancel/ }).count() === 0, 'no Cancel on a cancelled operation');
    await screenshot('operation-cancelled');
  });

  await step('a video that is not ready says why nothing plays (no player, no request to the playback service)', async () => {
    const before = playbackRequests.length;
    await page.goto(`${API_URL}/console/#/videos/${cancelledVideoId}`);
    const notice = page.getByTestId('playback-unavailable');
    await notice.waitFor();
    assert(/cancelled/.test(await notice.innerText()), `the notice says why: ${await notice.innerText()}`);
    assert(await page.getByTestId('hls-player').count() === 0, 'no player');
    assert(playbackRequests.length === before, 'nothing asked of the playback service');
    await screenshot('video-not-ready');
  });

  await step('an API error shows its problem title and detail, never a blank page', async () => {
    await page.goto(`${API_URL}/console/#/videos/vid_01jzzzzzzzzzzzzzzzzzzzzzzz`);
    const problem = page.locator('main .problem');
    await problem.waitFor();
    const text = await problem.innerText();
    assert(/Not found/.test(text) && /not found/.test(text.replace('Not found', '')), `problem shown: ${text}`);
    assert(await heading().count() === 1, 'the page keeps a heading');
    await screenshot('error-problem');
  });

  await step('bad console addresses show Not found (no crash, no request outside the api\'s routes)', async () => {
    for (const hash of ['#/endpoints/%', '#/videos/..', '#/events?id=..', '#/nope']) {
      const before = requests.length;
      await page.goto(`${API_URL}/console/${hash}`);
      await page.locator('main .problem').filter({ hasText: /not found/i }).waitFor();
      assert(await heading().count() === 1, `${hash}: the page keeps a heading`);
      const stray = requests.slice(before).filter((r) => /^GET http:\/\/[^/]+\/(\?|$)/.test(r));
      assert(stray.length === 0, `${hash}: requested the api root: ${stray}`);
    }
    // Signed in, the sign-in address goes to the first page.
    await page.goto(`${API_URL}/console/#/signin`);
    await heading().filter({ hasText: 'Endpoints' }).waitFor();
  });

  await step('a 401 while a page refreshes itself (a revoked key) signs out to the sign-in page', async () => {
    await page.goto(`${API_URL}/console/#/endpoints/${endpointId}`);
    await heading().filter({ hasText: HOOK_URL }).waitFor();
    const revoked = (route) => route.fulfill({ status: 401, contentType: 'application/problem+json',
      body: JSON.stringify({ type: '/problems/unauthorized', title: 'Unauthorized', status: 401, detail: 'unknown API key', code: 'unauthorized' }) });
    await page.route('**/webhook-endpoints/**', revoked);
    await heading().filter({ hasText: 'Sign in' }).waitFor({ timeout: 10_000 });
    assert(/unknown API key/.test(await page.locator('#error').innerText()), 'the 401 problem is shown');
    assert(await page.evaluate(() => sessionStorage.length) === 0, 'the refused key is forgotten');
    await page.unroute('**/webhook-endpoints/**', revoked);
    await page.getByLabel('API key').fill(API_KEY);
    await page.getByRole('button', { name: 'Sign in' }).click();
    await heading().filter({ hasText: HOOK_URL }).waitFor();
  });

  await step('Sign out also forgets the key in tabs opened from the console', async () => {
    const [other] = await Promise.all([page.waitForEvent('popup'), page.evaluate((u) => { window.open(u); }, `${API_URL}/console/#/operations`)]);
    await other.locator('main h1').filter({ hasText: 'Operations' }).waitFor();
    await page.getByRole('button', { name: 'Sign out' }).click();
    await heading().filter({ hasText: 'Sign in' }).waitFor();
    await other.locator('main h1').filter({ hasText: 'Sign in' }).waitFor({ timeout: 5_000 });
    for (const p of [page, other]) {
      const stored = await p.evaluate(() => JSON.stringify(sessionStorage) + JSON.stringify(localStorage));
      assert(!stored.includes(API_KEY), 'no key stored after signing out');
      assert(!(await p.content()).includes(API_KEY), 'no key in the page');
    }
    await other.close();
    assert(!requests.some((r) => r.includes(API_KEY)), 'the key never appears in a URL');
    await page.getByLabel('API key').fill(API_KEY);
    await page.getByRole('button', { name: 'Sign in' }).click();
    await heading().filter({ hasText: 'Endpoints' }).waitFor();
  });

  await step('Swagger UI at /docs renders under its strict CSP and forgets the key', async () => {
    const resp = await fetch(`${API_URL}/docs/`);
    const csp = resp.headers.get('content-security-policy') || '';
    assert(csp.includes("script-src 'self'") && csp.includes("frame-ancestors 'none'"), `docs CSP: ${csp}`);
    const docs = await browser.newPage();
    const errors = [];
    docs.on('pageerror', (e) => errors.push(`pageerror: ${e.message}`));
    docs.on('console', (m) => { if (m.type() === 'error') errors.push(`console: ${m.text()}`); });
    await docs.route(/^(?!http:\/\/127\.0\.0\.1[:/])/, (r) => { errors.push(`outside loopback: ${r.request().url()}`); r.abort(); });
    await docs.goto(`${API_URL}/docs/`);
    await docs.locator('.swagger-ui .info .title').waitFor({ timeout: 20000 });
    await docs.locator('.swagger-ui .opblock').first().waitFor({ timeout: 20000 });
    await docs.screenshot({ path: join(OUT, '90-docs.png') });
    const stored = await docs.evaluate(() => JSON.stringify({ ...localStorage }));
    assert(!stored.includes('authorized'), `Swagger UI keeps no authorization in localStorage: ${stored}`);
    await docs.close();
    assert(errors.length === 0, `Swagger UI under its CSP:\n${errors.join('\n')}`);
  });

  await step('accessibility basics: every control is labelled, actions are real buttons', async () => {
    for (const hash of ['#/endpoints', `#/endpoints/${endpointId}`, '#/operations', '#/events', `#/videos/${videoId}`]) {
      await page.goto(`${API_URL}/console/${hash}`);
      await page.locator('main h1').first().waitFor();
      await page.waitForTimeout(300);
      const unlabelled = await page.evaluate(() => [...document.querySelectorAll('input, select, textarea, button, progress, video')]
        .filter((el) => !(el.labels && el.labels.length) && !el.getAttribute('aria-label') && !el.closest('label') && !(el.textContent || '').trim())
        .map((el) => el.outerHTML.slice(0, 80)));
      assert(unlabelled.length === 0, `${hash}: unlabelled controls ${unlabelled}`);
      const fakeButtons = await page.locator('[onclick], a:not([href]), div[role=button], span[role=button]').count();
      assert(fakeButtons === 0, `${hash}: clickable non-buttons`);
    }
  });

  assert(pageErrors.length === 0, `errors in the page:\n${pageErrors.join('\n')}`);
  assert(blocked.length === 0, `requests outside loopback were attempted and blocked: ${blocked}`);
  console.log(`console test: every step passed in ${secs()} s (screenshots in ${OUT})`);
} catch (e) {
  console.error(`console test FAILED at ${secs()} s: ${e.stack || e}`);
  if (pageErrors.length) console.error(`errors in the page:\n${pageErrors.join('\n')}`);
  try { await screenshot('failure'); } catch { /* the page may be gone */ }
  process.exitCode = 1;
} finally {
  if (linkDir) rmSync(linkDir, { recursive: true, force: true });
  await browser.close().catch(() => {});
  server.close();
  server.closeAllConnections?.();
}

function document_cookie_has_key(cookies) {
  return cookies.some((c) => c.value.includes(API_KEY));
}
