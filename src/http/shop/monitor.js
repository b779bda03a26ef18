// The sale monitor: one voucher's sale read once a second from one admin
// route, GET /admin/vouchers/{id}/monitor, and the stock drawn as it
// drains.
"use strict";

(function () {
  const S = window.Seckill;
  const $ = (id) => document.getElementById(id);
  const setText = S.setText;
  const ADMIN_KEY = "seckill.admin";
  const EVERY_MS = 1000;
  // Two minutes of readings.
  const KEPT = 120;
  const SVG = "http://www.w3.org/2000/svg";

  const state = { voucherId: null, timer: null, samples: [], generation: 0, pause: null };

  function adminToken() {
    return sessionStorage.getItem(ADMIN_KEY) || "";
  }

  // The refusals a second, all codes together (a number, as every live
  // figure), and by code beside it.
  function refusalsTotal(refusals) {
    const sum = Object.values(refusals || {}).reduce((a, b) => a + b, 0);
    return String(Math.round(sum * 10) / 10);
  }

  function refusalsByCode(refusals) {
    const codes = Object.keys(refusals || {});
    if (codes.length === 0) return "";
    return "(" + codes.map((code) => code + " " + refusals[code] + "/s").join(", ") + ")";
  }

  const LIVE = ["live-stock", "live-sold", "live-orders-per-second", "live-serving", "live-waiting", "live-refusals", "live-p99-ms"];

  // Nothing of a voucher no longer watched stays on the page.
  function blank() {
    for (const id of LIVE) setText(id, "–");
    setText("live-voucher", "");
    setText("live-refusal-codes", "");
    $("live-refusals").dataset.codes = "";
    state.samples = [];
    draw();
  }

  function show(body) {
    setText("live-voucher", "· " + body.title + " (" + body.voucher_id + ")");
    setText("live-stock", String(body.stock));
    setText("live-sold", body.sold + " of " + body.initial_stock);
    setText("live-orders-per-second", String(body.orders_per_second));
    const room = body.waiting_room;
    setText("live-serving", room ? String(room.serving) : "0");
    setText("live-waiting", room ? room.waiting + " (" + room.admit_per_second + " admitted a second)" : "no waiting room");
    setText("live-refusals", refusalsTotal(body.refusals_per_second));
    setText("live-refusal-codes", refusalsByCode(body.refusals_per_second));
    $("live-refusals").dataset.codes = Object.keys(body.refusals_per_second || {}).join(" ");
    // No purchase answered in the window: 0, a number like every live
    // figure, marked empty.
    const p99 = body.purchase_p99_ms;
    setText("live-p99-ms", p99 === null ? "0" : String(p99));
    $("live-p99-ms").dataset.empty = p99 === null ? "true" : "false";
    state.samples.push({ at: Date.now(), stock: body.stock, initial: body.initial_stock });
    if (state.samples.length > KEPT) state.samples.shift();
    draw();
  }

  function node(name, attributes) {
    const element = document.createElementNS(SVG, name);
    for (const key of Object.keys(attributes)) element.setAttribute(key, String(attributes[key]));
    return element;
  }

  // The stock against time, scaled to the initial stock: an axis, the
  // line, and the last value.
  function draw() {
    const svg = $("stock-chart");
    const width = 600;
    const height = 200;
    const pad = 24;
    const samples = state.samples;
    const top = Math.max(1, ...samples.map((s) => Math.max(s.initial, s.stock)));
    const x = (i) => pad + ((width - 2 * pad) * i) / Math.max(1, KEPT - 1);
    const y = (stock) => height - pad - ((height - 2 * pad) * stock) / top;
    const parts = [
      node("line", { x1: pad, y1: height - pad, x2: width - pad, y2: height - pad, class: "axis" }),
      node("line", { x1: pad, y1: pad, x2: pad, y2: height - pad, class: "axis" }),
    ];
    const label = node("text", { x: 2, y: pad - 8, class: "label" });
    label.textContent = String(top);
    parts.push(label);
    if (samples.length > 0) {
      const offset = KEPT - samples.length;
      const points = samples.map((s, i) => x(offset + i).toFixed(1) + "," + y(s.stock).toFixed(1));
      parts.push(node("polyline", { points: points.join(" "), class: "line" }));
      const last = samples[samples.length - 1];
      const now = node("text", { x: width - pad - 4, y: Math.max(pad, y(last.stock) - 6), class: "label end" });
      now.textContent = String(last.stock);
      parts.push(now);
    }
    svg.replaceChildren(...parts);
    svg.dataset.samples = String(samples.length);
  }

  // One reading, then the next a second after this one began (never two
  // at once from one page).
  async function read(generation) {
    if (generation !== state.generation || state.voucherId === null) return;
    const began = Date.now();
    const answer = await S.call("GET", "/admin/vouchers/" + state.voucherId + "/monitor", {
      token: adminToken(),
    });
    if (generation !== state.generation) return;
    if (answer.status === 200) {
      if ($("message").dataset.error) S.say("", "");
      show(answer.body);
    } else {
      S.sayError(answer);
      if ([400, 403, 404].includes(answer.status)) {
        // A wrong admin token, or no such voucher: asking again each
        // second changes nothing. The token goes (it is asked for again);
        // watching resumes with the next choice.
        blank();
        if (answer.status === 403) {
          sessionStorage.removeItem(ADMIN_KEY);
          $("admin-token").placeholder = "";
        }
        return;
      }
    }
    const wait = answer.status === 200 ? EVERY_MS : Math.max(EVERY_MS, (answer.retryAfter || 1) * 1000);
    state.timer = setTimeout(() => read(generation), Math.max(0, wait - (Date.now() - began)));
  }

  // Starts watching what the form says. `typing`: started by a pause in
  // typing, which keeps the token in its field (it may not be whole yet).
  function watch(typing) {
    clearTimeout(state.pause);
    const typed = $("admin-token").value.trim();
    if (typed) {
      sessionStorage.setItem(ADMIN_KEY, typed);
      if (typing !== true) {
        $("admin-token").value = "";
        $("admin-token").placeholder = "saved for this tab";
      }
    }
    const id = Number.parseInt($("monitor-voucher").value, 10);
    if (!Number.isInteger(id) || id < 1) {
      S.say("Choose a voucher to watch.", "");
      return;
    }
    if (!adminToken()) {
      S.say("Enter the admin token.", "");
      return;
    }
    if (id !== state.voucherId) blank();
    state.voucherId = id;
    history.replaceState(null, "", "#/vouchers/" + id);
    S.say("Watching voucher " + id + ".", "");
    state.generation += 1;
    clearTimeout(state.timer);
    read(state.generation);
  }

  // The voucher to watch when none is named: the newest one on sale (the
  // sale just opened, not an older one still running), else the next to
  // start; null when there is none.
  function newestOnSale(body) {
    const now = Date.parse(body.server_time);
    const vouchers = body.vouchers || [];
    const open = vouchers.filter((v) => Date.parse(v.begin_time) <= now);
    if (open.length > 0) return Math.max(...open.map((v) => v.id));
    return vouchers.length > 0 ? vouchers[0].id : null;
  }

  // The vouchers on sale and coming, to pick from.
  async function offer() {
    const answer = await S.call("GET", "/vouchers");
    if (answer.status !== 200) return;
    const list = $("voucher-ids");
    list.replaceChildren(
      ...answer.body.vouchers.map((v) => {
        const option = document.createElement("option");
        option.value = String(v.id);
        option.label = v.title;
        return option;
      }),
    );
    const pick = newestOnSale(answer.body);
    if (!$("monitor-voucher").value && pick !== null && state.voucherId === null) {
      $("monitor-voucher").value = String(pick);
    }
  }

  $("setup").addEventListener("submit", (event) => {
    event.preventDefault();
    watch();
  });
  $("monitor-voucher").addEventListener("change", () => watch());
  // Both fields filled, in whichever order: watching starts once typing
  // pauses, without a click.
  for (const field of ["admin-token", "monitor-voucher"]) {
    $(field).addEventListener("input", () => {
      clearTimeout(state.pause);
      if (!$("monitor-voucher").value || !($("admin-token").value.trim() || adminToken())) return;
      state.pause = setTimeout(() => watch(true), 600);
    });
  }
  if (adminToken()) $("admin-token").placeholder = "saved for this tab";
  const wanted = /^#\/vouchers\/(\d+)$/.exec(location.hash);
  if (wanted) $("monitor-voucher").value = wanted[1];
  draw();
  offer().then(() => {
    if (adminToken() && $("monitor-voucher").value) watch();
  });
})();
