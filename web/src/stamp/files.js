// What the person chose, as entries {name, file}: names as `stampd stamp` would give them when
// run in the folder that holds what was chosen (a file: its name; a folder DIR: DIR/sub/file).

export const MAX_FILES = 1_000_000; // the server's STAMPD_MAX_MANIFEST_LINES default

// A file's path under the chosen folder's parent. Chromium's webkitRelativePath turns a
// backslash in a name into "/" (a file "a\b" reads "DIR/a/b"); File.name keeps it, so the last
// component is taken from there. (A backslash in a folder's name is lost the same way, and
// cannot be told apart from a subfolder.)
export function relativeName(file) {
  const path = file.webkitRelativePath;
  if (!path) return file.name;
  const mangled = file.name.replaceAll("\\", "/");
  return path.endsWith("/" + mangled) ? path.slice(0, -mangled.length) + file.name : path;
}

// From an <input type=file> (with or without webkitdirectory). `folder` is whether the input
// chose a folder: its files carry their path under the folder's parent (webkitRelativePath).
export function fromInput(input) {
  const files = [...input.files];
  return {
    entries: files.map((file) => ({ name: relativeName(file), file })),
    folder: files.some((f) => f.webkitRelativePath),
  };
}

function readAll(reader) {
  // readEntries answers at most 100 entries a call; an empty answer ends the folder.
  return new Promise((resolve, reject) => {
    const all = [];
    const next = () => reader.readEntries((batch) => {
      if (batch.length === 0) return resolve(all);
      all.push(...batch);
      if (all.length > MAX_FILES) return reject(new Error(`more than ${MAX_FILES} entries`));
      next();
    }, reject);
    next();
  });
}

const fileOf = (entry) => new Promise((resolve, reject) => entry.file(resolve, reject));

// From a drop (DataTransfer): files and folders, folders walked (webkitGetAsEntry). Entries'
// fullPath is "/DIR/sub/file": the name without its leading "/".
export async function fromDrop(dataTransfer) {
  const roots = [...dataTransfer.items]
    .filter((item) => item.kind === "file")
    .map((item) => item.webkitGetAsEntry?.())
    .filter(Boolean);
  if (roots.length === 0) {
    const files = [...dataTransfer.files];
    return { entries: files.map((file) => ({ name: file.name, file })), folder: false };
  }
  const entries = [];
  let folder = false;
  const stack = [...roots];
  while (stack.length) {
    const entry = stack.pop();
    if (entry.isDirectory) {
      folder = true;
      stack.push(...await readAll(entry.createReader()));
    } else if (entry.isFile) {
      entries.push({ name: entry.fullPath.replace(/^\//, ""), file: await fileOf(entry) });
    }
    if (entries.length > MAX_FILES) throw new Error(`more than ${MAX_FILES} files`);
  }
  return { entries, folder };
}
