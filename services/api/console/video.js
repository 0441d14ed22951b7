// Video page: source metadata, the poster, and every rendition playable in a
// <video> element from its time-limited URL.

import { api, segment } from './api.js';
import { h, time, badge, fmtBytes, fmtSeconds } from './dom.js';

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

/** Renders the page. */
export async function render(ctx) {
  const id = ctx.params[0];
  const v = await api('GET', `/videos/${segment(id)}`, undefined, { signal: ctx.signal });
  const name = v.filename || v.id;
  const poster = v.poster?.url || null;
  const renditions = v.renditions.length
    ? h('div', { class: 'grid' }, v.renditions.map((r) => h('figure', { 'data-rendition': r.name },
      r.url
        ? h('video', { controls: true, preload: 'metadata', src: r.url, poster, width: r.width, height: r.height, 'aria-label': `${name}, ${r.name} rendition` })
        : h('p', { class: 'muted' }, 'No download URL.'),
      h('figcaption', {},
        h('strong', {}, r.name), ` · ${r.width} × ${r.height} · ${(r.bitrate / 1e6).toFixed(2)} Mb/s · ${fmtBytes(r.size_bytes)}`,
        r.url_expires_at ? h('div', { class: 'small muted' }, 'URL valid until ', time(r.url_expires_at)) : null))))
    : h('p', { class: 'muted' }, v.status === 'processing' ? 'Still processing: renditions appear when the operation succeeds.' : 'No renditions.');
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
        h('dt', {}, 'Created'), h('dd', {}, time(v.created_at)),
        h('dt', {}, 'Updated'), h('dd', {}, time(v.updated_at)))),
    h('h2', {}, 'Source'),
    metadata(v.source),
    h('h2', {}, 'Poster'),
    poster
      ? h('figure', { class: 'poster' }, h('img', { src: poster, alt: `Poster frame of ${name}`, width: v.poster.width, height: v.poster.height }),
        h('figcaption', {}, `${v.poster.width} × ${v.poster.height}`))
      : h('p', { class: 'muted' }, 'No poster.'),
    h('h2', {}, 'Renditions'),
    renditions);
}
