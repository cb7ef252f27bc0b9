import{a as e}from"./chunk-IQ7UTJ7L.js";var t=e();document.getElementById("server-key").textContent=t.keys[0]?.fingerprint??"";document.body.dataset.ready="1";
