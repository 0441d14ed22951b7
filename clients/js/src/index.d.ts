/** Types of `@vid/upload` (src/index.js). Shapes follow the api's OpenAPI document. */

/** A presigned S3 UploadPart URL (`PartUrl`). */
export interface PartUrl {
  part_number: number;
  offset: number;
  length: number;
  url: string;
  /** RFC 3339. */
  expires_at: string;
}

/** The `201` answer of `POST /uploads` (`CreatedUpload`), as the customer's server passes it to the page. */
export interface CreatedUpload {
  id: string;
  /** `created` for a new upload. */
  status: 'created' | 'completed' | 'aborted' | 'expired';
  size_bytes: number;
  /** Bytes per part (the last may be shorter). */
  part_size: number;
  /** One presigned URL per part. */
  parts: PartUrl[];
  /** RFC 3339: the upload must be completed before then. */
  expires_at: string;
  /** The page's token (`vidu_…`), good for this upload and its operation only. */
  client_token: string;
}

/** An operation (`Operation`). */
export interface Operation {
  id: string;
  status: 'pending' | 'running' | 'succeeded' | 'failed' | 'cancelled';
  progress: number;
  /** RFC 3339. */
  created_at: string;
  /** RFC 3339. */
  updated_at: string;
  /** Set from `POST /uploads/{id}/complete` on: the video the operation produces. */
  metadata: { video_id?: string | null; phase?: string; [k: string]: unknown };
  result?: { video_id: string; [k: string]: unknown } | null;
  error?: { code: string; detail?: string; [k: string]: unknown } | null;
  [k: string]: unknown;
}

/** One part as `onProgress` reports it. */
export interface PartProgress {
  part_number: number;
  /** Bytes of the part. */
  length: number;
  /** Bytes of the part in storage or sent so far in this try. */
  loaded: number;
  /** `stored`: storage held it before this run; `done`: sent by this run. */
  state: 'stored' | 'pending' | 'sending' | 'retrying' | 'done' | 'failed';
  /** Tries of this part in this run. */
  attempts: number;
}

export interface Progress {
  uploadId: string;
  phase: 'uploading' | 'completing' | 'processing' | 'succeeded' | 'failed' | 'cancelled';
  /** Bytes of the file in storage (or in flight), of `total`. */
  loaded: number;
  total: number;
  parts: PartProgress[];
  /** Once completed: the transcode operation as last seen. */
  operation: Operation | null;
}

/** What a store (e.g. `localStorage`) needs for resume. */
export interface ResumeStore {
  readonly length: number;
  key(index: number): string | null;
  getItem(key: string): string | null;
  setItem(key: string, value: string): void;
  removeItem(key: string): void;
}

export interface UploadOptions {
  /** The `POST /uploads` answer (at least its `id`; its `parts` URLs are used if fresh), or just the upload id (to resume). */
  upload: CreatedUpload | (Pick<CreatedUpload, 'id'> & Partial<CreatedUpload>) | string;
  /** The upload's `client_token` (`vidu_…`). An API key (`vidk_…`) is refused. */
  token: string;
  /** The api's base URL; default: the page's origin. */
  apiUrl?: string;
  /** Parts in flight at once: a whole number ≥ 1 (default 4), else `invalid_argument`. */
  parallel?: number;
  onProgress?: (progress: Progress) => void;
  /** Stops the upload (pause): it stays resumable. */
  signal?: AbortSignal;
  /** Follow the operation over its event stream to a terminal status. */
  follow?: boolean;
  /** Where resume records go; default `localStorage`; `null`: none. */
  store?: ResumeStore | null;
}

export interface UploadResult {
  uploadId: string;
  /** The transcode operation (terminal when `follow` was set). */
  operation: Operation;
  videoId: string | null;
  /** Parts this run sent, in the order storage accepted them. */
  partsSent: number[];
  /** Parts storage already held (a resumed upload). */
  partsAlreadyStored: number[];
}

/** A saved, resumable upload. */
export interface SavedUpload {
  uploadId: string;
  token: string;
  apiUrl: string;
  name: string;
  size: number;
  lastModified: number;
  partSize: number;
  fingerprint: string;
  savedAt: number;
}

export class UploadError extends Error {
  /** The problem's `code`, or `network`, `storage_refused`, `aborted`, `api_key_refused`, `not_resumable`, … */
  /** `invalid_argument` (e.g. `parallel` not a whole number ≥ 1, no `apiUrl` outside a page) comes at once. */
  readonly code: string;
  /** HTTP status; 0 without an answer. */
  readonly status: number;
  /** Whether trying again may help. */
  readonly retryable: boolean;
  /** The RFC 9457 problem, when the api answered one. */
  readonly problem?: unknown;
  /** The part that failed, for part errors. */
  partNumber?: number;
  constructor(code: string, status: number, message: string, extra?: { retryable?: boolean; problem?: unknown; partNumber?: number });
}

export const DEFAULT_PARALLEL: number;
export const MAX_PART_ATTEMPTS: number;
export const MAX_RESIGNS: number;
export const STORAGE_PREFIX: string;

export function upload(file: Blob & { name?: string; lastModified?: number }, options: UploadOptions): Promise<UploadResult>;
export function followOperation(
  operationId: string,
  options: { apiUrl?: string; token: string; signal?: AbortSignal; onUpdate?: (op: Operation) => void },
): Promise<Operation>;
export function cancel(uploadId: string, options: { apiUrl?: string; token: string; store?: ResumeStore | null }): Promise<void>;
export function fingerprint(file: Blob & { name?: string; lastModified?: number }, partSize: number): Promise<string>;
export function findResumable(file: Blob & { name?: string; lastModified?: number }, store?: ResumeStore | null): Promise<SavedUpload | null>;
export function pendingUploads(store?: ResumeStore | null): SavedUpload[];
export function forget(uploadId: string, store?: ResumeStore | null): void;
export function backoff(attempt: number, random?: () => number): number;
