// Hashes files off the page's thread: streamed, constant memory (hash-wasm).
import { createSHA256, createSHA512 } from "hash-wasm";

self.onmessage = async (event) => {
  const { id, file, algorithm } = event.data;
  const hasher = algorithm === "sha512" ? await createSHA512() : await createSHA256();
  hasher.init();
  const reader = file.stream().getReader();
  let done = 0;
  for (;;) {
    const { value, done: end } = await reader.read();
    if (end) break;
    hasher.update(value);
    done += value.length;
    self.postMessage({ id, progress: done });
  }
  self.postMessage({ id, digest: hasher.digest("hex") });
};
