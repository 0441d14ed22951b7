// Compiled (not run) by `npm run typecheck`: the declarations describe the
// calls a page makes (README's five lines).
import { upload, UploadError, followOperation, type Progress } from '../src/index.js';

declare const file: File;
declare const created: { id: string; client_token: string };
const controller = new AbortController();
const result = await upload(file, {
  upload: created,
  token: created.client_token,
  parallel: 4,
  onProgress: (p: Progress) => console.log(p.loaded / p.total, p.parts.map((x) => x.state)),
  signal: controller.signal,
  follow: true,
});
const status: string = result.operation.status;
const op = await followOperation(result.operation.id, { token: created.client_token });
try {
  await upload(file, { upload: created.id, token: 'x' });
} catch (e) {
  if (e instanceof UploadError) console.log(e.code, e.status, e.retryable, status, op.id);
}
