import { pageConfig } from "./config.js";

const config = pageConfig();
document.getElementById("server-key").textContent = config.keys[0]?.fingerprint ?? "";
document.body.dataset.ready = "1";
