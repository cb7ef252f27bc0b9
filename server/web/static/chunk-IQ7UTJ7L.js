function e(){let t=document.getElementById("stampd-config");if(!t)throw new Error("the page has no configuration");return JSON.parse(t.textContent)}export{e as a};
