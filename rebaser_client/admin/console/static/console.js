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

  // -- the overview's charts: the console's samples (pages.py _charts), drawn as SVG, again with every update -----
  const SVG = "http://www.w3.org/2000/svg";
  const W = 300, H = 90, PAD = 4;
  function svg(name, attrs) {
    const el = document.createElementNS(SVG, name);
    for (const [k, v] of Object.entries(attrs)) el.setAttribute(k, String(v));
    return el;
  }
  function charts() {
    const box = $("#charts");
    if (!box) return;
    const data = JSON.parse(box.dataset.samples);
    const at = data.at;
    for (const figure of box.querySelectorAll("figure.chart")) {
      const key = figure.dataset.key;
      const points = [];
      at.forEach((t, i) => { if (data[key][i] !== null) points.push([t, data[key][i]]); });
      const last = points.length ? points[points.length - 1][1] : null;
      const max = Math.max(1, ...points.map((p) => p[1]));
      const t0 = at.length ? at[0] : 0, span = Math.max(1, (at.length ? at[at.length - 1] : 0) - t0);
      const x = (t) => PAD + ((t - t0) / span) * (W - 2 * PAD);
      const y = (v) => H - PAD - (v / max) * (H - 2 * PAD);
      const chart = svg("svg", {
        viewBox: `0 0 ${W} ${H}`, width: W, height: H, role: "img", class: "chart-svg",
        "data-n": points.length, "data-last": last === null ? "" : last, "data-max": max,
        "data-end": at.length ? at[at.length - 1] : "",
      });
      chart.append(svg("line", { x1: PAD, y1: H - PAD, x2: W - PAD, y2: H - PAD, class: "axis" }));
      chart.append(svg("text", { x: PAD, y: 12, class: "scale" }));
      chart.lastChild.textContent = String(Math.round(max * 100) / 100);
      chart.append(svg("polyline", {
        points: points.map(([t, v]) => `${x(t).toFixed(1)},${y(v).toFixed(1)}`).join(" "), class: "line",
      }));
      const title = svg("title", {});
      const minutes = Math.round(span / 6) / 10;
      title.textContent = `${figure.querySelector("figcaption").textContent.trim()}: the last ${minutes} min`;
      chart.prepend(title);
      figure.querySelector("svg")?.remove();
      figure.append(chart);
      const now = figure.querySelector(".now");
      if (now) now.textContent = last === null ? "" : String(Math.round(last * 100) / 100);
    }
  }
  charts();

  // -- the change-set list: every row's data in the page, only the rows on screen drawn ---------------------------
  // A list may hold tens of thousands of change sets: the browser lays out the fifty or so in view, not them all.
  const ROW = 27; // px: a row's height (console.css gives rows one line)
  const readOnly = document.body.dataset.readOnly === "1";
  function cell(tr, text, cls) {
    const td = tr.insertCell();
    if (cls) td.className = cls;
    if (text !== undefined) td.textContent = text;
    return td;
  }
  // An id (a ULID) as two spans: its start, cut with an ellipsis when the column is narrow, and its last TAIL
  // characters, always shown: ULIDs made in the same period share their first characters, their ends tell them
  // apart. The whole id is the element's text (selecting and copying it copies it all) and its title.
  const TAIL = 10;
  function idElement(tag, id, props = {}) {
    const el = Object.assign(document.createElement(tag), { className: "id", title: id, ...props });
    el.append(
      Object.assign(document.createElement("span"), { className: "id-head", textContent: id.slice(0, -TAIL) }),
      Object.assign(document.createElement("span"), { className: "id-tail", textContent: id.slice(-TAIL) }),
    );
    return el;
  }
  function drawRow([ws, cs, states, owner, queued, since, dead, held]) {
    const tr = document.createElement("tr");
    tr.id = `r-${ws}-${cs}`;
    Object.assign(tr.dataset, { ws, cs, states: states.join(" ") });
    cell(tr).append(idElement("a", cs, { href: `/change-sets/${ws}/${cs}` }));
    cell(tr).append(idElement("span", ws));
    const badges = cell(tr);
    if (!states.length) badges.textContent = "idle";
    for (const s of states) badges.append(Object.assign(document.createElement("span"), { className: `badge ${s}`, textContent: s }));
    // The record names the daemon that held it last: its owner only while a daemon holds its task.
    const owned = cell(tr, owner ? (held ? owner : `last: ${owner}`) : "-", held ? "" : "last-owner");
    if (owner) owned.title = held ? `held by ${owner} now` : `no daemon holds it; ${owner} held it last`;
    cell(tr, String(queued), "n");
    const aged = cell(tr, since === null ? "-" : undefined, "age");
    if (since !== null) aged.dataset.since = String(since);
    cell(tr, String(dead), "n");
    const act = cell(tr);
    if (!readOnly) {
      const verb = states.includes("paused") ? "resume" : "pause";
      act.append(Object.assign(document.createElement("a"), { href: "#", role: "button", className: "act", textContent: verb }));
      act.firstChild.dataset.action = verb;
    }
    return tr;
  }
  const list = (() => {
    const table = $("#rows");
    const source = $("#rows-data");
    if (!table || !source) return null;
    const rows = JSON.parse(source.textContent);
    const tbody = table.tBodies[0];
    const empty = $("tr.empty", tbody);
    const spacer = () => {
      const tr = Object.assign(document.createElement("tr"), { className: "spacer" });
      tr.insertCell().colSpan = 8;
      return tr;
    };
    const top = spacer();
    const bottom = spacer();
    let at = new Map();
    const reindex = () => (at = new Map(rows.map((d, i) => [`r-${d[0]}-${d[1]}`, i])));
    let pending = false;
    function draw() {
      pending = false;
      const offset = table.getBoundingClientRect().top + window.scrollY + 30;
      const first = Math.max(0, Math.floor((window.scrollY - offset) / ROW) - 20);
      const last = Math.min(rows.length, first + Math.ceil(window.innerHeight / ROW) + 40);
      top.style.height = `${first * ROW}px`;
      bottom.style.height = `${(rows.length - last) * ROW}px`;
      const drawn = rows.slice(first, last).map(drawRow);
      tbody.replaceChildren(...(rows.length ? [top, ...drawn, bottom] : empty ? [empty] : []));
      const shown = $("#shown");
      if (shown) shown.textContent = String(rows.length);
      tick();
    }
    const later = () => { if (!pending) { pending = true; requestAnimationFrame(draw); } };
    window.addEventListener("scroll", later, { passive: true });
    window.addEventListener("resize", later);
    reindex();
    draw();
    return {
      counts(counts) {
        // The state drop-down and the total count the same rows as the list, updated with it.
        for (const option of document.querySelectorAll('select[name="state"] option')) {
          const n = counts[option.value];
          if (n !== undefined) option.textContent = `${option.value || "any"} (${n})`;
        }
        const total = $("#total");
        if (total && counts[""] !== undefined) total.textContent = String(counts[""]);
      },
      update(upsert, remove) {
        for (const d of upsert) {
          const i = at.get(`r-${d[0]}-${d[1]}`);
          if (i === undefined) { at.set(`r-${d[0]}-${d[1]}`, rows.length); rows.push(d); } else rows[i] = d;
        }
        if (remove.some((id) => at.has(id))) {
          const gone = new Set(remove);
          for (let i = rows.length - 1; i >= 0; i--) if (gone.has(`r-${rows[i][0]}-${rows[i][1]}`)) rows.splice(i, 1);
          reindex();
        }
        later();
      },
    };
  })();

  // -- live updates ----------------------------------------------------------------------------------------------
  function parseRows(html) {
    const body = document.createElement("tbody");
    body.innerHTML = html;
    return [...body.children];
  }
  const stream = document.body.dataset.stream;
  if (stream) {
    const live = $("#live");
    const source = new EventSource(stream);
    source.onopen = () => live.classList.add("on");
    source.onerror = () => live.classList.remove("on");
    // The console's own reads of NATS failing: the dot turns amber and the page says what is stale, and since when.
    source.addEventListener("health", (e) => {
      const data = JSON.parse(e.data);
      const box = $("#problem");
      live.classList.toggle("stale", Boolean(data.problem));
      live.title = data.problem ? `stale, not live: ${data.problem}` : "live updates";
      if (box) {
        box.hidden = !data.problem;
        box.textContent = data.problem || "";
      }
    });
    source.addEventListener("rows", (e) => {
      const data = JSON.parse(e.data);
      if (list) list.update(data.upsert, data.remove);
      if (list && data.counts) list.counts(data.counts);
    });
    source.addEventListener("event", (e) => {
      const data = JSON.parse(e.data);
      const tbody = $("#timeline tbody");
      if (!tbody || tbody.querySelector(`tr[data-id="${CSS.escape(data.id)}"]`)) return;
      tbody.querySelector("tr.empty")?.remove();
      for (const tr of parseRows(data.html)) tbody.prepend(tr); // newest first: the stream sends oldest first
    });
    for (const [name, target] of [["overview", "main"], ["detail", "#detail"], ["dead-letters", "#dead-letters"]]) {
      source.addEventListener(name, (e) => {
        const box = $(target);
        if (box) box.innerHTML = JSON.parse(e.data).html;
        tick();
        charts();
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
    const button = e.target.closest(".act");
    if (!button) return;
    e.preventDefault();
    const action = button.dataset.action;
    // A list row's button carries no body: the row says which change set (pages.py keeps rows small).
    const row = button.closest("tr[data-cs]");
    const body = button.dataset.body
      ? JSON.parse(button.dataset.body)
      : { targets: [{ workspace_id: row.dataset.ws, change_set_id: row.dataset.cs }] };
    const box = $("#outcome");
    box.hidden = true;
    box.replaceChildren();
    const planned = await post(action, { ...body, confirm: false });
    if (!planned.ok) return show(false, planned.lines);
    if (!(await ask(planned.question, planned.targets))) return show(null, ["not confirmed: nothing was done"]);
    const done = await post(action, { ...planned.body, confirm: true });
    show(done.ok, done.lines);
  });
})();
