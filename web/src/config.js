// The page's configuration, written by the server into <script type="application/json"
// id="stampd-config"> (server/api/web.py): the server's URL, its keys, the log's key and
// policy, and the names of the built files (assets.json).
export function pageConfig() {
  const el = document.getElementById("stampd-config");
  if (!el) throw new Error("the page has no configuration");
  return JSON.parse(el.textContent);
}
