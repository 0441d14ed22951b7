// Benchmark half of scripts/bench-browser-upload.sh: uploads BENCH_FILE with
// the upload library (clients/js, served by the api at
// /console/vid-upload.js) in Debian's headless Chromium, 4 parts at once,
// straight to storage; prints the seconds from the first byte read to the
// answer of `complete`, as JSON. POST /uploads is made here with the API key,
// as a customer's server would; the page gets only the client token.
import { chromium } from 'playwright-core';
import { statSync } from 'node:fs';

const { BENCH_API_URL: API, BENCH_API_KEY: KEY, BENCH_FILE: FILE, CHROMIUM = '/usr/bin/chromium' } = process.env;
const size = statSync(FILE).size;
const browser = await chromium.launch({ executablePath: CHROMIUM, headless: true, args: ['--no-sandbox', '--disable-gpu', '--disable-dev-shm-usage'] });
try {
  const page = await browser.newPage();
  await page.goto(`${API}/console/`);
  await page.evaluate(() => { const i = document.createElement('input'); i.type = 'file'; i.id = 'bench-file'; document.body.append(i); });
  await page.setInputFiles('#bench-file', FILE);
  const resp = await fetch(`${API}/uploads`, {
    method: 'POST',
    headers: { Authorization: `Bearer ${KEY}`, 'Content-Type': 'application/json' },
    body: JSON.stringify({ size_bytes: size, content_type: 'video/mp4', filename: 'bench.bin' }),
  });
  if (resp.status !== 201) throw new Error(`POST /uploads answered ${resp.status}: ${await resp.text()}`);
  const created = await resp.json();
  const result = await page.evaluate(async (created) => {
    const lib = await import('/console/vid-upload.js');
    const file = document.getElementById('bench-file').files[0];
    const t0 = performance.now();
    const r = await lib.upload(file, { upload: created, token: created.client_token, parallel: 4, store: null });
    return { seconds: (performance.now() - t0) / 1000, parts: r.partsSent.length, operation: r.operation.id };
  }, created);
  console.log(JSON.stringify({ ...result, upload_id: created.id, bytes: size }));
} finally {
  await browser.close();
}
