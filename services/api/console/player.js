// The players of the video page.
//
// `streamPlayer`: a playback ID's HLS URL played with hls.js (vendor/hls.min.mjs,
// imported only when a video page needs it) in a <video>, with the rung
// playing shown and a picker (Auto, then each rung). hls.js runs on the page
// (`enableWorker: false`): the console's CSP allows no worker.
//
// `nativePlayer`: the same URL given straight to a plain <video>, for browsers
// whose `canPlayType('application/vnd.apple.mpegurl')` says they play HLS
// themselves (Safari; recent Chromium).
//
// `storyboardScrubber`: a seek strip under the hls.js player; the pointer over
// it shows the storyboard tile of that time (issue 20: storyboard.json from
// the playback origin, the sheet as a CSS background cropped to the tile),
// a click seeks there. State for the console test: `data-time` (s) and
// `data-tile` (index) on the preview.
//
// Both expose their state as data attributes on their <figure> for the
// console test: `data-state` (loading, ready, error), `data-level` (the hls.js
// level index playing), `data-levels` (how many), `data-auto`.

import { h, problemBox } from './dom.js';

export const HLS_TYPE = 'application/vnd.apple.mpegurl';

/** What `canPlayType` says about HLS in a plain <video>: '', 'maybe' or 'probably'. */
export function nativeHlsSupport() {
  return document.createElement('video').canPlayType(HLS_TYPE);
}

const mbps = (bps) => `${(bps / 1e6).toFixed(2)} Mb/s`;

/**
 * `720p · 1280 × 720 · 2.50 Mb/s` for an hls.js level. The name is the
 * playlist's NAME if it has one, else the static rendition of the same size,
 * else `<height>p` (the playback service names rung directories that way).
 */
export function rungLabel(level, renditions = []) {
  const same = renditions.find((r) => r.width === level.width && r.height === level.height);
  const name = level.name || same?.name || (level.height ? `${level.height}p` : 'audio only');
  const size = level.width && level.height ? ` · ${level.width} × ${level.height}` : '';
  return `${name}${size} · ${mbps(level.bitrate)}`;
}

/** Stops a <video> from loading or playing anything more (leaving the page). */
function unload(video) {
  video.pause();
  video.removeAttribute('src');
  video.load();
}

/** A problem box for a <video>'s MediaError. */
function mediaProblem(video, what) {
  const e = video.error;
  return problemBox({ title: `${what}: media error`, detail: e ? `MediaError ${e.code}${e.message ? `: ${e.message}` : ''}` : 'unknown error' });
}

/**
 * The hls.js player of `url` (an http(s) HLS master playlist URL). `renditions`
 * name the rungs; `signal` (the page's) destroys the player when the page is left.
 */
export function streamPlayer({ url, poster, name, renditions, signal }) {
  const video = h('video', { controls: true, preload: 'auto', playsinline: true, poster, 'aria-label': `${name}, adaptive stream (hls.js)` });
  const playing = h('strong', { 'data-testid': 'rung-playing' }, '—');
  const select = h('select', { id: 'rung', disabled: true, 'data-key': 'rung' }, h('option', { value: '-1' }, 'Auto'));
  const status = h('span', { class: 'small muted', role: 'status' }, 'Loading the player…');
  const problems = h('div');
  const figure = h('figure', { class: 'player', 'data-testid': 'hls-player', 'data-state': 'loading' },
    video,
    storyboardScrubber({ url, video, signal }),
    h('figcaption', {},
      h('div', { class: 'row' },
        h('div', {}, h('strong', {}, 'hls.js'), ' · playing ', playing),
        h('div', { class: 'field inline' }, h('label', { for: 'rung' }, 'Rung'), select),
        status),
      problems));

  const fail = (box) => {
    figure.dataset.state = 'error';
    problems.replaceChildren(box);
  };
  video.addEventListener('error', () => { if (!signal.aborted) fail(mediaProblem(video, 'The stream cannot play')); });

  (async () => {
    const { default: Hls } = await import('./vendor/hls.min.mjs');
    if (signal.aborted) return;
    if (!Hls.isSupported()) {
      fail(problemBox({ title: 'hls.js cannot play here', detail: 'This browser has no Media Source Extensions.' }));
      return;
    }
    const hls = new Hls({ enableWorker: false });
    signal.addEventListener('abort', () => { hls.destroy(); unload(video); }, { once: true });
    const label = (index) => {
      const level = hls.levels[index];
      return level ? rungLabel(level, renditions) : '—';
    };
    const showPlaying = () => {
      const index = Number(figure.dataset.level ?? -1);
      playing.textContent = index >= 0 ? `${label(index)}${hls.autoLevelEnabled ? ' (Auto)' : ''}` : '—';
      figure.dataset.auto = String(hls.autoLevelEnabled);
    };
    hls.on(Hls.Events.MANIFEST_PARSED, (_, data) => {
      select.replaceChildren(
        h('option', { value: '-1' }, 'Auto (by bandwidth)'),
        ...data.levels.map((level, i) => h('option', { value: String(i), 'data-width': level.width, 'data-height': level.height }, label(i))));
      select.disabled = false;
      figure.dataset.levels = String(data.levels.length);
      figure.dataset.state = 'ready';
      status.textContent = `${data.levels.length} rung${data.levels.length === 1 ? '' : 's'} in the master playlist`;
    });
    // LEVEL_SWITCHED: the fragment at the play head is from another level.
    hls.on(Hls.Events.LEVEL_SWITCHED, (_, data) => {
      figure.dataset.level = String(data.level);
      showPlaying();
    });
    hls.on(Hls.Events.ERROR, (_, data) => {
      // Non-fatal errors (a stall while a switch refills the buffer, a retried
      // request) are hls.js's to recover from; only fatal ones stop playback.
      if (!data.fatal) {
        figure.dataset.lastWarning = data.details;
        return;
      }
      const http = data.response && data.response.code ? ` (HTTP ${data.response.code})` : '';
      fail(problemBox({ title: 'The stream cannot play', detail: `hls.js: ${data.type}, ${data.details}${http}` }));
    });
    select.addEventListener('change', () => {
      const index = Number(select.value);
      // A picked rung switches at once (the buffer ahead is replaced); Auto
      // lets hls.js choose from the next segment on.
      if (index >= 0) hls.currentLevel = index; else hls.loadLevel = -1;
      showPlaying();
    });
    hls.attachMedia(video);
    hls.loadSource(url);
    status.textContent = 'Loading the master playlist…';
  })().catch((e) => {
    if (!signal.aborted) fail(problemBox({ title: 'The player did not load', detail: String(e && e.message ? e.message : e) }));
  });
  return figure;
}

/** The tile of `board` (storyboard.json) showing time `t` (s): the last one starting at or before it. */
export function tileAt(board, t) {
  let index = 0;
  board.tiles.forEach((tile, i) => { if (tile.start <= t) index = i; });
  return index;
}

/**
 * A seek strip for `video` whose hover shows the storyboard tile of the
 * pointer's time. `url` is the master playlist URL `…/play/{pb}.m3u8`; the
 * storyboard is `…/play/{pb}/storyboard.json` (its `url` relative to it).
 * Nothing is shown when the video has no storyboard.
 */
export function storyboardScrubber({ url, video, signal }) {
  const jsonUrl = url.replace(/\.m3u8(\?.*)?$/, (_, q) => `/storyboard.json${q || ''}`);
  const preview = h('div', { class: 'storyboard-tile', 'data-testid': 'storyboard-preview', hidden: true });
  const strip = h('div', { class: 'scrub', 'data-testid': 'scrub', role: 'slider', 'aria-label': 'Seek (storyboard preview)', tabindex: '0', hidden: true }, preview);
  fetch(jsonUrl, { signal }).then((r) => (r.ok ? r.json() : null)).then((board) => {
    if (!board || !board.tiles || !board.tiles.length) return;
    const sheet = new URL(board.url, jsonUrl).href;
    strip.hidden = false;
    preview.style.width = `${board.tile_width}px`;
    preview.style.height = `${board.tile_height}px`;
    preview.style.backgroundImage = `url("${sheet}")`;
    const timeAt = (e) => {
      const box = strip.getBoundingClientRect();
      const f = Math.min(1, Math.max(0, (e.clientX - box.left) / box.width));
      return { f, t: f * (Number.isFinite(video.duration) ? video.duration : board.duration) };
    };
    strip.addEventListener('pointermove', (e) => {
      const { f, t } = timeAt(e);
      const i = tileAt(board, t);
      const tile = board.tiles[i];
      preview.style.backgroundPosition = `-${tile.x}px -${tile.y}px`;
      preview.style.left = `calc(${(f * 100).toFixed(2)}% - ${board.tile_width / 2}px)`;
      preview.dataset.time = t.toFixed(2);
      preview.dataset.tile = String(i);
      preview.hidden = false;
    });
    strip.addEventListener('pointerleave', () => { preview.hidden = true; });
    strip.addEventListener('click', (e) => { video.currentTime = timeAt(e).t; });
  }).catch(() => {});
  return strip;
}

/** `url` in a plain <video>, played by the browser's own HLS support. */
export function nativePlayer({ url, poster, name, support, signal }) {
  const video = h('video', { controls: true, preload: 'metadata', playsinline: true, poster, src: url, 'aria-label': `${name}, the browser's own HLS player` });
  const status = h('span', { class: 'small muted', role: 'status' }, 'Loading…');
  const problems = h('div');
  const figure = h('figure', { class: 'player', 'data-testid': 'native-player', 'data-state': 'loading' },
    video,
    h('figcaption', {},
      h('div', {}, h('strong', {}, 'Native HLS'), ` · canPlayType('${HLS_TYPE}') says “${support}”: the browser plays the same URL without hls.js.`),
      status,
      problems));
  video.addEventListener('loadedmetadata', () => {
    figure.dataset.state = 'ready';
    status.textContent = `Loaded: ${video.videoWidth} × ${video.videoHeight}, ${video.duration.toFixed(1)} s.`;
  });
  video.addEventListener('error', () => {
    if (signal.aborted) return;
    figure.dataset.state = 'error';
    status.textContent = '';
    problems.replaceChildren(mediaProblem(video, 'Native playback failed'));
  });
  signal.addEventListener('abort', () => unload(video), { once: true });
  return figure;
}
