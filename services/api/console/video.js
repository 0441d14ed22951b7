// Video page: the stream of its first public playback ID played with hls.js
// (the rung playing shown, and a picker), the same URL in the browser's own
// HLS player where it has one, the playback IDs with their HLS and DASH URLs,
// source metadata, the poster, and the static MP4 renditions as downloads.

import { api, segment } from './api.js';
import { h, time, badge, fmtBytes, fmtSeconds, httpUrl } from './dom.js';
import { nativeHlsSupport, nativePlayer, streamPlayer } from './player.js';

function metadata(src) {
  if (!src) return h('p', { class: 'muted' }, 'Not probed yet.');
  const rows = [
    ['Container', src.container],
    ['Duration', fmtSeconds(src.duration_seconds)],
    ['Dimensions', `${src.width} × ${src.height}`],
    ['Rotation', `${src.rotation}°`],
    ['Video codec', src.video_codec],
    ['Audio codec', src.audio_codec || 'none'],
    ['Frame rate', src.frame_rate ? `${Number(src.frame_rate).toFixed(2)} fps` : '—'],
    ['Size', fmtBytes(src.size_bytes)],
  ];
  return h('dl', { class: 'meta', 'data-testid': 'source-metadata' }, rows.flatMap(([k, v]) => [h('dt', {}, k), h('dd', {}, v)]));
}

/** A URL from the api as a link showing the URL itself; plain text if it is not http(s). */
function urlLink(url) {
  if (!url) return h('span', { class: 'muted' }, '—');
  const href = httpUrl(url);
  return href ? h('a', { href, class: 'mono wrap' }, url) : h('span', { class: 'mono wrap' }, url);
}

/** The players, or why nothing plays. */
function players(v, name, signal) {
  const notice = (text) => h('p', { class: 'notice-muted', 'data-testid': 'playback-unavailable' }, text);
  if (v.status !== 'ready') {
    return notice(v.status === 'processing'
      ? 'Not ready yet: the stream plays once the transcode has succeeded.'
      : `Nothing to play: the video is ${v.status}.`);
  }
  const ids = v.playback_ids || [];
  if (!ids.length) return notice('This video has no playback ID, so it has no stream URL: add one with POST /videos/{id}/playback-ids.');
  const pb = ids.find((p) => p.policy === 'public');
  if (!pb) return notice('Only signed playback IDs: their URLs need a token signed by your server, which the console does not have.');
  const url = httpUrl(pb.hls_url);
  if (!url) return notice('The playback ID has no HLS URL.');
  const poster = httpUrl(v.poster?.url) || undefined;
  const support = nativeHlsSupport();
  return h('div', { class: 'grid players' },
    streamPlayer({ url, poster, name, renditions: v.renditions || [], signal }),
    support
      ? nativePlayer({ url, poster, name, support, signal })
      : h('p', { class: 'small muted' }, 'This browser does not play HLS natively (canPlayType says no): hls.js plays it through Media Source Extensions.'));
}

function playbackIds(v) {
  const ids = v.playback_ids || [];
  if (!ids.length) return null;
  return h('table', { 'data-testid': 'playback-ids' },
    h('thead', {}, h('tr', {}, ['Playback ID', 'Policy', 'URLs', 'Created'].map((t) => h('th', { scope: 'col' }, t)))),
    h('tbody', {}, ids.map((p) => h('tr', { 'data-playback-id': p.id },
      h('td', { class: 'mono' }, p.id),
      h('td', {}, p.policy),
      h('td', {},
        h('div', { 'data-url': 'hls' }, 'HLS ', urlLink(p.hls_url)),
        h('div', { 'data-url': 'dash' }, 'DASH ', urlLink(p.dash_url))),
      h('td', {}, time(p.created_at))))));
}

function downloads(v) {
  if (!v.renditions.length) {
    let why = 'No static renditions.';
    if (v.status === 'processing') why = 'Still processing: the MP4 files appear when the operation succeeds.';
    else if (v.mp4_support === 'none') why = 'No static renditions: the video was uploaded with "mp4_support": "none".';
    return h('p', { class: 'muted' }, why);
  }
  return h('table', { 'data-testid': 'downloads' },
    h('thead', {}, h('tr', {}, ['Rendition', 'Resolution', 'Bitrate', 'Size', 'Download'].map((t) => h('th', { scope: 'col' }, t)))),
    h('tbody', {}, v.renditions.map((r) => {
      const href = httpUrl(r.url);
      return h('tr', { 'data-rendition': r.name },
        h('td', {}, h('strong', {}, r.name)),
        h('td', {}, `${r.width} × ${r.height}`),
        h('td', { class: 'num' }, `${(r.bitrate / 1e6).toFixed(2)} Mb/s`),
        h('td', { class: 'num' }, fmtBytes(r.size_bytes)),
        h('td', {},
          href
            ? h('a', { href, download: '', 'aria-label': `Download the ${r.name} MP4` }, 'MP4')
            : h('span', { class: 'muted' }, 'No download URL.'),
          r.url_expires_at ? h('div', { class: 'small muted' }, 'link valid until ', time(r.url_expires_at)) : null));
    })));
}

/** Renders the page. */
export async function render(ctx) {
  const id = ctx.params[0];
  const v = await api('GET', `/videos/${segment(id)}`, undefined, { signal: ctx.signal });
  const name = v.filename || v.id;
  const poster = httpUrl(v.poster?.url);
  ctx.main.replaceChildren(
    h('p', { class: 'breadcrumb' }, h('a', { href: '#/operations' }, '← Operations')),
    h('h1', {}, name),
    h('div', { class: 'panel' },
      h('dl', { class: 'meta' },
        h('dt', {}, 'Id'), h('dd', { class: 'mono' }, v.id),
        h('dt', {}, 'Status'), h('dd', {}, badge(v.status)),
        h('dt', {}, 'Version'), h('dd', {}, String(v.version)),
        h('dt', {}, 'Operation'), h('dd', { class: 'mono' }, v.operation_id),
        h('dt', {}, 'Content type'), h('dd', {}, v.content_type),
        v.mp4_support ? [h('dt', {}, 'MP4 support'), h('dd', {}, v.mp4_support)] : null,
        h('dt', {}, 'Created'), h('dd', {}, time(v.created_at)),
        h('dt', {}, 'Updated'), h('dd', {}, time(v.updated_at)))),
    h('h2', {}, 'Playback'),
    players(v, name, ctx.signal),
    playbackIds(v),
    h('h2', {}, 'Source'),
    metadata(v.source),
    h('h2', {}, 'Poster'),
    poster
      ? h('figure', { class: 'poster' }, h('img', { src: poster, alt: `Poster frame of ${name}`, width: v.poster.width, height: v.poster.height }),
        h('figcaption', {}, `${v.poster.width} × ${v.poster.height}`))
      : h('p', { class: 'muted' }, 'No poster.'),
    h('h2', {}, 'Static renditions (MP4 downloads)'),
    downloads(v));
}
