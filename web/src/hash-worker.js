// Hashes files off the page's thread (hash-wasm): each file streamed (file.stream()) into one
// reused buffer, so memory stays constant whatever the size; one hasher for every file.
//
// In:  {id, files: [File...], algorithm: "sha256" | "sha512"}   (or {id, file, algorithm})
// Out: {id, progress: bytes hashed so far, all files together}   at most PROGRESS_MS apart
//      {id, index, digest}                                       as each file is done
//      {id, digests: [hex...], digest: the first}                 at the end
//      {id, error: message}                                      when a file cannot be read
// Cancel by terminating the worker (the page does): nothing outlives it.
import { createSHA256, createSHA512 } from "hash-wasm";

const PROGRESS_MS = 100; // ~10 progress messages a second, whatever the chunk size
const CHUNK = 8 << 20; // bytes per update of the hasher
const hashers = {};

async function hasher(algorithm) {
  if (algorithm !== "sha256" && algorithm !== "sha512") throw new Error(`no algorithm ${algorithm}`);
  hashers[algorithm] ??= await (algorithm === "sha512" ? createSHA512() : createSHA256());
  return hashers[algorithm];
}

// One file's bytes, CHUNK at a time, into one reused buffer: a BYOB reader fills it (no
// allocation per read, so memory stays flat; the default reader's fresh 64 KiB chunks grew
// the renderer by ~175 MB over 1 GiB before the collector caught up), and each full buffer
// is one update of the hasher. Browsers whose Blob streams are not byte streams get the
// default reader.
async function* chunks(file, state) {
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
    if (end) return;
  }
}

async function hashFiles(id, files, algorithm) {
  const h = await hasher(algorithm);
  const state = { buffer: new ArrayBuffer(CHUNK) };
  const digests = [];
  let done = 0;
  let last = performance.now();
  for (let index = 0; index < files.length; index++) {
    h.init();
    for await (const chunk of chunks(files[index], state)) {
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
  const { id, file, files, algorithm = "sha256" } = event.data;
  try {
    await hashFiles(id, files ?? [file], algorithm);
  } catch (e) {
    self.postMessage({ id, error: `${e?.name ?? "Error"}: ${e?.message ?? e}` });
  }
};
