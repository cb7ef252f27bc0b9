// The server's answers, as the page needs them: a digest stamp (POST /v1/stamps), a manifest
// (POST /v1/manifests), a stamp's log proof (GET /v1/proofs/<serial>?wait=). Same origin:
// the page's CSP allows no other.

export class ServerError extends Error {
  // status: the HTTP status (0: no answer); retryAfter: seconds, or null.
  constructor(message, status = 0, retryAfter = null) {
    super(message);
    this.status = status;
    this.retryAfter = retryAfter;
  }
}

async function refusal(response) {
  let detail = "";
  try {
    const problem = await response.json();
    detail = [problem.title, problem.detail].filter(Boolean).join(": ");
  } catch {
    detail = response.statusText;
  }
  const after = response.headers.get("Retry-After");
  const retryAfter = after !== null && /^\d+$/.test(after) ? Number(after) : null;
  return new ServerError(`the server answered ${response.status}${detail ? ` (${detail})` : ""}`,
    response.status, retryAfter);
}

async function send(path, init) {
  let response;
  try {
    response = await fetch(path, { cache: "no-store", ...init });
  } catch (e) {
    if (e.name === "AbortError") throw e;
    throw new ServerError(`the server could not be reached (${e.message})`);
  }
  if (!response.ok) throw await refusal(response);
  return response;
}

// {algorithm, digest, time, utc, server, serial, key, receipt}
export async function stampDigest(algorithm, digest, signal) {
  const response = await send("/v1/stamps", {
    method: "POST", signal,
    headers: { "Content-Type": "application/x-www-form-urlencoded", Accept: "application/json" },
    body: `${algorithm}=${digest}`,
  });
  return response.json();
}

// The signed manifest, as text.
export async function stampManifest(body, signal) {
  const response = await send("/v1/manifests", {
    method: "POST", signal, headers: { "Content-Type": "text/plain" }, body,
  });
  return response.text();
}

// The stamp's c2sp.org/tlog-proof@v1, or null when the log has not covered it within `wait`
// seconds (404 with Retry-After).
export async function fetchProof(serial, wait, signal) {
  try {
    const response = await send(`/v1/proofs/${encodeURIComponent(serial)}?wait=${wait}`,
      { signal });
    return await response.text();
  } catch (e) {
    if (e instanceof ServerError && e.status === 404 && e.retryAfter !== null) return null;
    throw e;
  }
}
