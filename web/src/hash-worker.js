// Hashes files off the page's thread (hash-wasm): each file streamed (file.stream()) into a
// few reused buffers, read by a second worker (this same script) while this one hashes, so
// memory stays constant whatever the size; one hasher for every file.
//
// In:  {id, files: [File...], algorithm: "sha256" | "sha512"}   (or {id, file, algorithm})
// Out: {id, progress: bytes hashed so far, all files together}   at most PROGRESS_MS apart
//      {id, index, digest}                                       as each file is done
//      {id, digests: [hex...], digest: the first}                 at the end
//      {id, error: message}                                      when a file cannot be read
// Cancel by terminating the worker (the page does): its reader, a worker it started, ends with
// it, and nothing outlives them. (The reader's own messages, {read}, {buffer}, {chunk},
// {end}, are between the two.)
import { createSHA256, createSHA512 } from "hash-wasm";

const LIVE_LOCK = "stampd-hash-worker-";

// A lock held for as long as this worker lives: the browser releases it when the worker ends,
// however it ends (terminated, with its owner, closed), so `navigator.locks.query()` on the
// page lists the live hashing and reading workers (the tests count them so).
navigator.locks?.request(`${LIVE_LOCK}${Math.random()}`, () => new Promise(() => {}));
const PROGRESS_MS = 100; // ~10 progress messages a second, whatever the chunk size
const CHUNK = 8 << 20; // bytes per update of the hasher
const hashers = {};

async function hasher(algorithm) {
  if (algorithm !== "sha256" && algorithm !== "sha512") throw new Error(`no algorithm ${algorithm}`);
  hashers[algorithm] ??= await (algorithm === "sha512" ? createSHA512() : createSHA256());
  return hashers[algorithm];
}

// One file's bytes, CHUNK at a time, into reused buffers (`take` gives the next one; without
// it, one buffer): a BYOB reader fills them (no allocation per read, so memory stays flat;
// the default reader's fresh 64 KiB chunks grew the renderer by ~175 MB over 1 GiB before the
// collector caught up), and each full buffer is one update of the hasher. Browsers whose
// Blob streams are not byte streams get the default reader.
async function* chunks(file, state, take = null) {
  const stream = file.stream();
  let reader;
  try {
    reader = stream.getReader({ mode: "byob" });
  } catch {
    reader = null;
  }
  if (reader === null) {
    const plain = stream.getReader();
    for (;;) {
      const { value, done } = await plain.read();
      if (done) return;
      yield value;
    }
  }
  for (;;) {
    if (take) state.buffer = await take();
    state.buffer ??= new ArrayBuffer(CHUNK);
    let filled = 0;
    let end = false;
    while (filled < CHUNK) {
      const { value, done } = await reader.read(new Uint8Array(state.buffer, filled, CHUNK - filled));
      if (value) state.buffer = value.buffer; // the read hands the buffer back, transferred
      if (done) {
        end = true;
        break;
      }
      filled += value.byteLength;
    }
    if (filled) yield new Uint8Array(state.buffer, 0, filled);
    else if (take) giveBuffer(state.buffer);
    if (end) return;
  }
}

// ---- reading in a second worker ----------------------------------------------------------
// Hashing is synchronous: while a buffer is hashed, a reader on the same thread stops pulling
// the file, and the browser stops sending it once its pipe is full. So a reader worker of its
// own (this same script, told {read}) fills BUFFERS buffers in turn while the hasher hashes
// the last one; buffers are transferred back and forth (never copied), and only BUFFERS of
// them exist: memory stays flat.
const BUFFERS = 3;
let readerPool = null; // the reader role: its free buffers
let readerWaiting = null;

function takeBuffer() {
  if (readerPool.length) return Promise.resolve(readerPool.pop());
  return new Promise((resolve) => { readerWaiting = resolve; });
}

async function readRole(file) {
  readerPool ??= Array.from({ length: BUFFERS }, () => new ArrayBuffer(CHUNK));
  const state = {};
  try {
    for await (const chunk of chunks(file, state, takeBuffer)) {
      self.postMessage({ chunk: chunk.buffer, offset: chunk.byteOffset, length: chunk.byteLength },
        [chunk.buffer]);
    }
    self.postMessage({ end: true });
  } catch (e) {
    self.postMessage({ error: `${e?.name ?? "Error"}: ${e?.message ?? e}` });
  }
}

function giveBuffer(buffer) {
  if (buffer.byteLength !== CHUNK) return; // a default reader's chunk, not one of ours
  if (readerWaiting) {
    const resolve = readerWaiting;
    readerWaiting = null;
    resolve(buffer);
  } else {
    readerPool.push(buffer);
  }
}

// The hasher's side: the chunks of `file` as the reader worker sends them; each is handed
// back (transferred) once hashed.
async function* viaReader(reader, file) {
  const queue = [];
  let wake = null;
  reader.onmessage = ({ data }) => {
    queue.push(data);
    wake?.();
  };
  reader.onerror = (e) => {
    queue.push({ error: e.message || "the reading worker failed" });
    wake?.();
  };
  reader.postMessage({ read: file });
  for (;;) {
    while (!queue.length) await new Promise((resolve) => { wake = resolve; });
    wake = null;
    const item = queue.shift();
    if (item.end) return;
    if (item.error) throw new Error(item.error);
    yield new Uint8Array(item.chunk, item.offset, item.length);
    reader.postMessage({ buffer: item.chunk }, [item.chunk]);
  }
}

let readerWorker; // undefined: not tried yet; null: none (hash inline)

function reader() {
  if (readerWorker === undefined) {
    try {
      readerWorker = typeof Worker === "function" && typeof ReadableStreamBYOBReader === "function"
        ? new Worker(self.location.href, { type: "module" }) : null;
    } catch {
      readerWorker = null;
    }
  }
  return readerWorker;
}

async function hashFiles(id, files, algorithm) {
  const h = await hasher(algorithm);
  const state = { buffer: null };
  const digests = [];
  let done = 0;
  let last = performance.now();
  const r = reader();
  for (let index = 0; index < files.length; index++) {
    h.init();
    const source = r ? viaReader(r, files[index]) : chunks(files[index], state);
    for await (const chunk of source) {
      h.update(chunk);
      done += chunk.byteLength;
      const now = performance.now();
      if (now - last >= PROGRESS_MS) {
        last = now;
        self.postMessage({ id, progress: done });
      }
    }
    const digest = h.digest("hex");
    digests.push(digest);
    self.postMessage({ id, index, digest });
  }
  self.postMessage({ id, progress: done });
  self.postMessage({ id, digests, digest: digests[0] });
}

self.onmessage = async (event) => {
  const { id, file, files, algorithm = "sha256", read, buffer } = event.data;
  if (read) return readRole(read);
  if (buffer) return giveBuffer(buffer);
  try {
    await hashFiles(id, files ?? [file], algorithm);
  } catch (e) {
    self.postMessage({ id, error: `${e?.name ?? "Error"}: ${e?.message ?? e}` });
  }
};
