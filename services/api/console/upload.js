// The upload page (issue 21): drop or choose video files; each is created
// with the operator's API key (POST /uploads) and then sent by the upload
// library (`vid-upload.js`, served from clients/js/src/index.js) with only
// the upload's client token: parts in parallel straight to storage, progress
// per file and per part, pause (abort, the upload stays resumable) and
// resume, cancel (DELETE). After a reload the page lists the unfinished
// uploads kept in localStorage and resumes one when its file is chosen again
// (the fingerprint proves it is the same file). A finished upload links to
// its video page.

import { api } from './api.js';
import { h, fmtBytes, problemBox, problemOf } from './dom.js';
import { upload, cancel, findResumable, pendingUploads, forget, fingerprint, followOperation } from './vid-upload.js';

/** Parts sent at once per file. */
const PARALLEL = 4;

export async function render(ctx) {
  rows.clear();
  const list = h('ul', { class: 'uploads stack', id: 'upload-list', 'aria-live': 'polite' });
  const input = h('input', { id: 'upload-files', type: 'file', multiple: true, accept: 'video/*' });
  const zone = h('div', { class: 'panel dropzone', id: 'upload-drop', tabindex: '0' },
    h('p', {}, 'Drop video files here, or choose them: '), input);
  zone.addEventListener('dragover', (ev) => { ev.preventDefault(); zone.classList.add('over'); });
  zone.addEventListener('dragleave', () => zone.classList.remove('over'));
  zone.addEventListener('drop', (ev) => {
    ev.preventDefault();
    zone.classList.remove('over');
    startAll([...(ev.dataTransfer?.files ?? [])]);
  });
  input.addEventListener('change', () => { startAll([...input.files]); input.value = ''; });

  const resumeBox = h('section', { id: 'upload-resume', class: 'stack' });
  ctx.main.replaceChildren(h('h1', {}, 'Upload'), zone, resumeBox, list);
  renderResumable();

  function startAll(files) {
    for (const file of files) startNew(file).catch((e) => ctx.showProblem(problemOf(e)));
  }

  /** Unfinished uploads of earlier visits: choose the file again to resume. */
  function renderResumable() {
    const saved = pendingUploads(localStorage).filter((s) => !rows.has(s.uploadId));
    if (!saved.length) { resumeBox.replaceChildren(); return; }
    resumeBox.replaceChildren(
      h('h2', {}, 'Unfinished uploads'),
      h('ul', { class: 'stack' }, saved.map((s) => {
        const pick = h('input', { type: 'file', accept: 'video/*', 'data-resume': s.uploadId, 'aria-label': `Choose ${s.name} again to resume` });
        const note = h('span', { class: 'small' });
        pick.addEventListener('change', async () => {
          const file = pick.files[0];
          pick.value = '';
          if (!file) return;
          const same = file.size === s.size && file.name === s.name && file.lastModified === s.lastModified
            && (await fingerprint(file, s.partSize)) === s.fingerprint;
          if (!same) { note.textContent = ' That is not the same file (name, size, date or content differ).'; return; }
          startRow(file, s.uploadId, s.token);
          renderResumable();
        });
        const discard = h('button', { type: 'button', class: 'secondary', onclick: async () => {
          try { await cancel(s.uploadId, { token: s.token, store: localStorage }); } catch { forget(s.uploadId, localStorage); }
          renderResumable();
        } }, 'Discard');
        return h('li', { class: 'panel', 'data-pending': s.uploadId },
          h('strong', {}, s.name), ` ${fmtBytes(s.size)} — `, 'choose the file again to resume: ', pick, ' ', discard, note);
      })));
  }

  /** A file dropped or chosen: resume it if it is a known unfinished upload, else create one. */
  async function startNew(file) {
    const known = await findResumable(file, localStorage);
    if (known && !rows.has(known.uploadId)) {
      startRow(file, known.uploadId, known.token);
      renderResumable();
      return;
    }
    const created = await api('POST', '/uploads', {
      size_bytes: file.size,
      content_type: file.type || 'video/mp4',
      filename: file.name,
    }, { signal: ctx.signal });
    // Only the client token goes to the library: never the API key.
    startRow(file, created, created.client_token);
  }

  /** One file's row: progress of the file and of each part; pause, resume, cancel. */
  function startRow(file, created, token) {
    const uploadId = typeof created === 'string' ? created : created.id;
    const bar = h('progress', { max: String(file.size), value: '0', 'aria-label': `${file.name} progress` });
    const status = h('span', { class: 'small', 'data-role': 'status' }, 'starting');
    const partsBox = h('div', { class: 'parts', 'data-role': 'parts' });
    const pause = h('button', { type: 'button', class: 'secondary', 'data-role': 'pause' }, 'Pause');
    const stop = h('button', { type: 'button', class: 'secondary', 'data-role': 'cancel' }, 'Cancel');
    const link = h('span', { 'data-role': 'result' });
    const error = h('div');
    const li = h('li', { class: 'panel stack', 'data-upload': uploadId },
      h('div', {}, h('strong', {}, file.name), ` ${fmtBytes(file.size)} `, status),
      bar, partsBox, h('div', {}, pause, ' ', stop, ' ', link), error);
    list.append(li);
    const row = { controller: null, running: false, done: false };
    rows.set(uploadId, row);
    const partBars = new Map();

    const onProgress = (p) => {
      bar.value = p.loaded;
      status.textContent = p.phase === 'uploading' ? `${Math.floor((100 * p.loaded) / p.total)} %` : p.phase;
      li.dataset.phase = p.phase;
      for (const part of p.parts) {
        let el = partBars.get(part.part_number);
        if (!el) {
          el = h('progress', { max: String(part.length), value: '0', 'data-part': String(part.part_number), title: `part ${part.part_number}` });
          partBars.set(part.part_number, el);
          partsBox.append(el);
        }
        el.value = part.loaded;
        el.dataset.state = part.state;
      }
    };

    const run = async () => {
      row.controller = new AbortController();
      row.running = true;
      pause.textContent = 'Pause';
      error.replaceChildren();
      try {
        const result = await upload(file, {
          upload: created, token, apiUrl: location.origin, parallel: PARALLEL,
          onProgress, signal: row.controller.signal, store: localStorage,
        });
        pause.disabled = true;
        stop.disabled = true;
        const final = await watchOperation(result.operation, token, row.controller.signal);
        row.done = true;
        li.dataset.phase = final.status;
        status.textContent = final.status;
        const videoId = final.metadata?.video_id ?? result.videoId;
        if (videoId) link.replaceChildren(h('a', { href: `#/videos/${encodeURIComponent(videoId)}`, 'data-role': 'video-link' }, 'Open the video'));
      } catch (e) {
        if (e.code === 'aborted') {
          status.textContent = row.cancelled ? 'cancelled' : 'paused';
          li.dataset.phase = status.textContent;
          pause.textContent = 'Resume';
        } else {
          status.textContent = 'failed';
          li.dataset.phase = 'failed';
          error.replaceChildren(problemBox({ title: `Upload failed (${e.code ?? 'error'})`, detail: e.message, status: e.status }));
          pause.textContent = 'Retry';
        }
      } finally {
        row.running = false;
        // Later visits resume the upload from the stored record; the first
        // create answer's URLs may have expired by then.
        if (typeof created !== 'string') created = created.id;
      }
    };
    pause.addEventListener('click', () => {
      if (row.running) row.controller.abort(); else if (!row.done && !row.cancelled) run();
    });
    stop.addEventListener('click', async () => {
      row.cancelled = true;
      row.controller?.abort();
      pause.disabled = true;
      stop.disabled = true;
      try { await cancel(uploadId, { token, store: localStorage }); status.textContent = 'cancelled'; li.dataset.phase = 'cancelled'; } catch (e) { error.replaceChildren(problemBox(problemOf(e))); }
    });
    ctx.signal.addEventListener('abort', () => row.controller?.abort(), { once: true });
    run();
  }
}

/** Rows of this page visit, by upload id. */
const rows = new Map();

/**
 * Event streams the page keeps open at once: a browser allows 6 HTTP/1.1
 * connections per origin, and every other api call of the console needs one.
 */
const MAX_STREAMS = 2;
/** Seconds between `GET /operations/{id}` of the operations beyond MAX_STREAMS. */
const POLL_MS = 3000;
let openStreams = 0;

/**
 * Follows `op` to `succeeded`, `failed` or `cancelled`: over its event stream
 * while fewer than MAX_STREAMS are open, else by polling `GET /operations/{id}`.
 * Rejects with `{ code: 'aborted' }` on `signal`.
 */
async function watchOperation(op, token, signal) {
  const terminal = (o) => ['succeeded', 'failed', 'cancelled'].includes(o.status);
  if (terminal(op)) return op;
  if (openStreams < MAX_STREAMS) {
    openStreams += 1;
    try { return await followOperation(op.id, { token, apiUrl: location.origin, signal }); } finally { openStreams -= 1; }
  }
  const stopped = () => Object.assign(new Error('stopped'), { code: 'aborted' });
  for (;;) {
    await new Promise((resolve, reject) => {
      if (signal.aborted) return reject(stopped());
      const t = setTimeout(resolve, POLL_MS);
      signal.addEventListener('abort', () => { clearTimeout(t); reject(stopped()); }, { once: true });
    });
    try {
      const resp = await fetch(`/operations/${encodeURIComponent(op.id)}`, { headers: { Authorization: `Bearer ${token}` }, signal });
      if (resp.ok) op = await resp.json();
    } catch (e) {
      if (signal.aborted) throw stopped();
    }
    if (terminal(op)) return op;
  }
}
