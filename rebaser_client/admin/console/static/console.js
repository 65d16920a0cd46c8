// The rebaser console's one script: live updates (server-sent events), ages that count up in the browser, and
// actions that ask the console what they would do, ask the operator, then do it and show the outcome.
// No framework and no build step: served as it is, from the package (docs/console.md).
"use strict";
(() => {
  const csrf = document.querySelector('meta[name="csrf"]').content;
  const $ = (sel, root = document) => root.querySelector(sel);

  // -- ages ------------------------------------------------------------------------------------------------------
  function age(seconds) {
    if (seconds < 10) return `${Math.max(0, seconds).toFixed(1)}s`;
    const s = Math.floor(seconds);
    if (s < 60) return `${s}s`;
    if (s < 3600) return `${Math.floor(s / 60)}m${String(s % 60).padStart(2, "0")}s`;
    if (s < 86400) return `${Math.floor(s / 3600)}h${String(Math.floor((s % 3600) / 60)).padStart(2, "0")}m`;
    return `${Math.floor(s / 86400)}d${String(Math.floor((s % 86400) / 3600)).padStart(2, "0")}h`;
  }
  function tick() {
    const now = Date.now() / 1000;
    for (const cell of document.querySelectorAll("[data-since]")) {
      cell.textContent = age(now - parseFloat(cell.dataset.since));
    }
  }
  tick();
  setInterval(tick, 1000);

  // -- live updates ----------------------------------------------------------------------------------------------
  function parseRows(html) {
    const body = document.createElement("tbody");
    body.innerHTML = html;
    return [...body.children];
  }
  function place(tbody, tr) {
    const old = document.getElementById(tr.id);
    if (old) old.replaceWith(tr);
    else tbody.appendChild(tr);
    const empty = $("tr.empty", tbody);
    if (empty) empty.remove();
  }
  const stream = document.body.dataset.stream;
  if (stream) {
    const live = $("#live");
    const source = new EventSource(stream);
    source.onopen = () => live.classList.add("on");
    source.onerror = () => live.classList.remove("on");
    source.addEventListener("rows", (e) => {
      const data = JSON.parse(e.data);
      const tbody = $("#rows tbody");
      if (!tbody) return;
      for (const html of data.upsert) for (const tr of parseRows(html)) place(tbody, tr);
      for (const id of data.remove) document.getElementById(id)?.remove();
      const shown = $("#shown");
      if (shown) shown.textContent = String(tbody.querySelectorAll("tr[id]").length);
      tick();
    });
    source.addEventListener("event", (e) => {
      const data = JSON.parse(e.data);
      const tbody = $("#timeline tbody");
      if (!tbody || tbody.querySelector(`tr[data-id="${CSS.escape(data.id)}"]`)) return;
      for (const tr of parseRows(data.html)) tbody.appendChild(tr);
    });
    for (const [name, target] of [["overview", "main"], ["detail", "#detail"], ["dead-letters", "#dead-letters"]]) {
      source.addEventListener(name, (e) => {
        const box = $(target);
        if (box) box.innerHTML = JSON.parse(e.data).html;
        tick();
      });
    }
    source.addEventListener("reload", () => location.reload());
  }

  // -- actions ---------------------------------------------------------------------------------------------------
  async function post(action, body) {
    let response;
    try {
      response = await fetch(`/api/actions/${encodeURIComponent(action)}`, {
        method: "POST",
        credentials: "same-origin",
        headers: { "Content-Type": "application/json", "X-Rebaser-CSRF": csrf },
        body: JSON.stringify(body),
      });
    } catch (err) {
      return { ok: false, lines: [`the console did not answer: ${err}`] };
    }
    try {
      return await response.json();
    } catch (err) {
      return { ok: false, lines: [`${response.status} ${response.statusText}`] };
    }
  }
  function ask(question, targets) {
    const dialog = $("#confirm");
    $(".question", dialog).textContent = question;
    const list = $(".targets", dialog);
    list.replaceChildren(...targets.map((t) => Object.assign(document.createElement("li"), { textContent: t })));
    dialog.returnValue = "";
    dialog.showModal();
    return new Promise((resolve) => dialog.addEventListener("close", () => resolve(dialog.returnValue === "yes"), { once: true }));
  }
  function show(ok, lines) {
    const box = $("#outcome");
    box.hidden = false;
    box.className = ok === true ? "ok" : ok === false ? "failed" : "";
    const close = Object.assign(document.createElement("button"), { textContent: "×", className: "close" });
    close.onclick = () => (box.hidden = true);
    box.replaceChildren(close, ...lines.map((l) => Object.assign(document.createElement("p"), { textContent: l })));
  }
  document.addEventListener("click", async (e) => {
    const button = e.target.closest("button.act");
    if (!button) return;
    const action = button.dataset.action;
    const box = $("#outcome");
    box.hidden = true;
    box.replaceChildren();
    const planned = await post(action, { ...JSON.parse(button.dataset.body), confirm: false });
    if (!planned.ok) return show(false, planned.lines);
    if (!(await ask(planned.question, planned.targets))) return show(null, ["not confirmed: nothing was done"]);
    const done = await post(action, { ...planned.body, confirm: true });
    show(done.ok, done.lines);
  });
})();
