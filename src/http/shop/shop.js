// The buyer's page: the vouchers on sale and coming, one voucher with its
// countdown on the server's clock, the waiting room, the purchase, and the
// order as it changes (pay in the demo, cancel).
"use strict";

(function () {
  const S = window.Seckill;
  const $ = (id) => document.getElementById(id);
  const setText = S.setText;
  const DEMO = document.body.dataset.demo === "true";
  const TOKEN_KEY = "seckill.token";
  const USER_KEY = "seckill.user";
  const ORDER_KEY = "seckill.order.";
  // How often the list and the voucher are read again (each read also
  // measures the server's clock again).
  const REFRESH_MS = 2000;
  // How often a pending order is asked after (well under the per-user
  // limit of the order routes).
  const ORDER_POLL_MS = 700;
  // How often an unpaid order is read again: paid through the provider,
  // cancelled elsewhere, or expired, it changes without this page.
  const UNPAID_POLL_MS = 2000;
  const QUEUE_KEY = "seckill.queue.";

  const state = {
    vouchers: [],
    voucherId: null,
    voucher: null,
    queue: null,
    queueTimer: null,
    order: null,
    orderTimer: null,
    blockedUntil: 0,
    busy: false,
    joining: false,
    refreshing: false,
  };

  function token() {
    return sessionStorage.getItem(TOKEN_KEY);
  }

  // The user a token names, where it says: a v1 token's second field, or a
  // JWT's `sub`.
  function userOf(value) {
    const parts = value.split(".");
    if (parts[0] === "v1" && parts.length === 4) return parts[1];
    if (parts.length === 3) {
      try {
        const json = atob(parts[1].replace(/-/g, "+").replace(/_/g, "/"));
        return JSON.parse(json).sub || null;
      } catch (e) {
        return null;
      }
    }
    return null;
  }

  function showAccount() {
    const signedIn = Boolean(token());
    const user = sessionStorage.getItem(USER_KEY);
    $("who").textContent = signedIn
      ? "Signed in" + (user ? " as user " + user : "") + "."
      : "Not signed in.";
    // Shown signed in too: the next buyer in this tab signs in as another
    // demo user without signing out first.
    $("sign-in").hidden = !DEMO;
    $("sign-in").textContent = signedIn ? "Sign in as another demo user" : "Sign in as a new demo user";
    $("paste").hidden = signedIn;
    $("paste").open = !DEMO && !signedIn;
    $("sign-out").hidden = !signedIn;
    updateButtons();
  }

  // Forgets the user signed in: their token, tickets and the order shown
  // (an order id kept for the tab is read again with the next token: the
  // same user sees it, another is answered 404 and forgets it).
  function forgetUser() {
    sessionStorage.removeItem(TOKEN_KEY);
    sessionStorage.removeItem(USER_KEY);
    for (const key of Object.keys(sessionStorage)) {
      if (key.startsWith(QUEUE_KEY)) sessionStorage.removeItem(key);
    }
    stopQueue();
    stopOrder();
    state.queue = null;
    state.order = null;
    showQueue();
    showOrder();
  }

  function signedIn(value, user) {
    // A ticket and an order are their user's: the one signed in now
    // starts afresh.
    forgetUser();
    sessionStorage.setItem(TOKEN_KEY, value);
    if (user) sessionStorage.setItem(USER_KEY, String(user));
    showAccount();
    S.say("Signed in.", "");
    if (state.voucherId) loadOrder();
  }

  async function demoSignIn() {
    const answer = await S.call("POST", "/demo/users");
    if (answer.status !== 200) return S.sayError(answer);
    signedIn(answer.body.token, answer.body.user_id);
  }

  function pasteSignIn(event) {
    event.preventDefault();
    const value = $("token-input").value.trim();
    if (!value) return;
    $("token-input").value = "";
    signedIn(value, userOf(value));
  }

  function signOut() {
    forgetUser();
    showAccount();
    S.say("Signed out.", "");
  }

  // ---- the vouchers -------------------------------------------------

  async function loadList() {
    const answer = await S.call("GET", "/vouchers");
    if (answer.status !== 200) {
      S.sayError(answer, true);
      return false;
    }
    // On the list, the list was all there was to read.
    if (state.voucherId === null) S.recovered();
    S.clock.sync(answer.body.server_time, answer.sentAt, answer.receivedAt);
    state.vouchers = answer.body.vouchers || [];
    return true;
  }

  function phase(v, now) {
    const begin = Date.parse(v.begin_time);
    const end = Date.parse(v.end_time);
    if (now < begin) return { word: "coming", left: begin - now };
    if (now < end) return { word: "on sale", left: 0 };
    return { word: "ended", left: 0 };
  }

  function cardFacts(v, now) {
    const p = phase(v, now);
    return S.money(v.price_cents) + " · " + v.stock + " left · " +
      (p.word === "coming" ? "starts in " + S.duration(p.left) : p.word);
  }

  // The cards: made again only when the vouchers change (a focused link
  // keeps its focus), their facts rewritten in place.
  function renderList() {
    const list = $("vouchers");
    const now = S.clock.now();
    const shown = Array.from(list.children).map((card) => card.dataset.voucherId);
    const ids = state.vouchers.map((v) => String(v.id));
    $("list-empty").hidden = state.vouchers.length > 0;
    if (shown.join(",") === ids.join(",")) {
      state.vouchers.forEach((v, i) => {
        list.children[i].querySelector("p").textContent = cardFacts(v, now);
      });
      return;
    }
    list.replaceChildren();
    for (const v of state.vouchers) {
      const item = document.createElement("li");
      item.className = "card";
      item.setAttribute("data-testid", "voucher-card");
      item.setAttribute("data-voucher-id", String(v.id));
      const link = document.createElement("a");
      link.href = "/shop/#/vouchers/" + v.id;
      link.textContent = v.title;
      const title = document.createElement("h3");
      title.append(link);
      const facts = document.createElement("p");
      facts.textContent = cardFacts(v, now);
      item.append(title, facts);
      list.append(item);
    }
  }

  async function loadVoucher() {
    const id = state.voucherId;
    // Read afresh (not the list as an earlier read left it): a background
    // error is then over.
    let fresh = await loadList();
    let v = state.vouchers.find((x) => x.id === id);
    if (!v) {
      // Ended, or unknown: the voucher's own route says which.
      const answer = await S.call("GET", "/vouchers/" + id);
      if (answer.status !== 200) {
        S.sayError(answer, true);
        return;
      }
      v = answer.body;
      fresh = true;
    }
    if (state.voucherId !== id) return;
    if (fresh) S.recovered();
    state.voucher = v;
    renderVoucher();
  }

  function maxUnits() {
    const v = state.voucher;
    const max = v && Number.isInteger(v.max_units_per_user) ? v.max_units_per_user : 1;
    return Math.max(1, max);
  }

  function renderVoucher() {
    const v = state.voucher;
    if (!v) return;
    $("v-title").textContent = v.title;
    $("v-price").textContent = S.money(v.price_cents);
    $("v-stock").textContent = String(v.stock);
    $("v-stock-word").textContent = v.stock === 1 ? "unit" : "units";
    const max = maxUnits();
    $("v-limits").textContent =
      (max > 1 ? "up to " + max + " units an order, " : "one unit an order, ") +
      v.max_orders_per_user + " orders at most";
    $("quantity-box").hidden = max <= 1;
    const box = $("quantity");
    box.max = String(max);
    // Named only where more than one unit may be bought; a value out of
    // the range (from another voucher) would stop the form unseen.
    if (max > 1) box.setAttribute("data-testid", "quantity");
    else box.removeAttribute("data-testid");
    const asked = Number.parseInt(box.value, 10);
    // Not while the buyer types in it (an empty box on the way to a number).
    if (document.activeElement !== box && (!Number.isInteger(asked) || asked < 1 || asked > max)) {
      box.value = "1";
    }
    $("room").hidden = !v.waiting_room;
    tick();
  }

  // Once a second: the countdown, on the server's clock.
  function tick() {
    const v = state.voucher;
    if (!v || $("voucher-view").hidden) return;
    const p = phase(v, S.clock.now());
    setText("v-countdown", S.duration(p.left));
    $("v-countdown").dataset.seconds = String(Math.ceil(p.left / 1000));
    setText("v-when-label", p.word === "coming" ? "Starts in" : "Started");
    setText(
      "v-phase",
      p.word === "coming" ? "Coming soon." : p.word === "on sale" ? "On sale now." : "The sale is over.",
    );
    updateButtons();
  }

  // ---- the waiting room ---------------------------------------------

  function stopQueue() {
    clearTimeout(state.queueTimer);
    state.queueTimer = null;
  }

  // Forgets the ticket: the join button shows again.
  function leaveQueue() {
    stopQueue();
    state.queue = null;
    if (state.voucherId !== null) sessionStorage.removeItem(QUEUE_KEY + state.voucherId);
    showQueue();
    updateButtons();
  }

  function showQueue() {
    const q = state.queue;
    $("join-queue").hidden = Boolean(q);
    if (!q) {
      $("queue-place").textContent = "not in the room";
      $("queue-detail").textContent = "";
      return;
    }
    $("queue-place").textContent = q.place === null ? "to be drawn at the start" : String(q.place);
    let detail = "· now serving " + q.serving;
    if (q.status === "admitted" && q.admitted_until) {
      detail += " · admitted: buy before " + S.clockTime(Date.parse(q.admitted_until) - S.clock.offset);
    } else if (q.status === "waiting") {
      detail += q.ahead === null || q.ahead === undefined ? " · waiting" : " · " + q.ahead + " ahead";
    } else if (q.status === "sold_out") {
      detail += " · sold out";
    }
    $("queue-detail").textContent = detail;
  }

  function queued(answer) {
    state.queue = answer.body;
    // Kept for the tab: a reload polls with it rather than joining again.
    if (answer.body.ticket) sessionStorage.setItem(QUEUE_KEY + state.voucherId, answer.body.ticket);
    showQueue();
    updateButtons();
    if (answer.body.status === "sold_out") S.say(S.MESSAGES.sold_out, "sold_out");
    else if (answer.body.status === "admitted") S.say("You are admitted: buy now.", "");
    // Exactly when the service says to ask again; admitted, once the
    // admission's window is over: the service then places the ticket again
    // at the back of the room, which a buyer who bought does not want (the
    // ticket is forgotten instead, and joining again is one click).
    let wait = (answer.retryAfter === null ? 1 : answer.retryAfter) * 1000;
    let next = pollQueue;
    if (answer.body.status === "admitted") {
      wait = Math.max(1000, Date.parse(answer.body.admitted_until) - S.clock.now() + 500);
      next = () => (liveOrder() ? leaveQueue() : pollQueue());
    }
    stopQueue();
    state.queueTimer = setTimeout(next, wait);
  }

  // Whether the buyer holds a live order of this voucher.
  function liveOrder() {
    const o = state.order;
    return Boolean(o) && ["pending", "unpaid", "paid"].includes(o.status);
  }

  // SHA-256's round constants and first hash (FIPS 180-4).
  const K = new Uint32Array([
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2,
  ]);
  const H0 = [0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19];
  const ror = (x, n) => (x >>> n) | (x << (32 - n));

  // SHA-256 of `bytes` (short: under 512 MiB), as eight 32-bit words. Here
  // rather than crypto.subtle, which a page served over plain HTTP to
  // another host than localhost does not have.
  function sha256(bytes) {
    const length = bytes.length;
    const padded = new Uint8Array(((length + 9 + 63) >> 6) << 6);
    padded.set(bytes);
    padded[length] = 0x80;
    const bits = length * 8;
    for (let i = 1; i <= 4; i++) padded[padded.length - i] = (bits >>> (8 * (i - 1))) & 0xff;
    const hash = Uint32Array.from(H0);
    const w = new Uint32Array(64);
    for (let at = 0; at < padded.length; at += 64) {
      for (let i = 0; i < 16; i++) {
        const j = at + 4 * i;
        w[i] = (padded[j] << 24) | (padded[j + 1] << 16) | (padded[j + 2] << 8) | padded[j + 3];
      }
      for (let i = 16; i < 64; i++) {
        const x = w[i - 15];
        const y = w[i - 2];
        const s0 = ror(x, 7) ^ ror(x, 18) ^ (x >>> 3);
        const s1 = ror(y, 17) ^ ror(y, 19) ^ (y >>> 10);
        w[i] = (w[i - 16] + s0 + w[i - 7] + s1) | 0;
      }
      let [a, b, c, d, e, f, g, h] = hash;
      for (let i = 0; i < 64; i++) {
        const t1 = (h + (ror(e, 6) ^ ror(e, 11) ^ ror(e, 25)) + ((e & f) ^ (~e & g)) + K[i] + w[i]) | 0;
        const t2 = ((ror(a, 2) ^ ror(a, 13) ^ ror(a, 22)) + ((a & b) ^ (a & c) ^ (b & c))) | 0;
        h = g;
        g = f;
        f = e;
        e = (d + t1) | 0;
        d = c;
        c = b;
        b = a;
        a = (t1 + t2) | 0;
      }
      [a, b, c, d, e, f, g, h].forEach((v, i) => (hash[i] += v));
    }
    return hash;
  }

  // A nonce whose SHA-256 after the room's challenge starts with `bits`
  // zero bits (at most 32: the first word says), searched a slice at a time
  // so that the page stays alive; null if the buyer left the voucher.
  async function solveProof(challenge, bits, id) {
    const encoder = new TextEncoder();
    for (let nonce = 0; ; nonce++) {
      if (Math.clz32(sha256(encoder.encode(challenge + nonce))[0]) >= bits) return String(nonce);
      if (nonce % 4096 === 4095) {
        await new Promise((resolve) => setTimeout(resolve, 0));
        if (state.voucherId !== id) return null;
      }
    }
  }

  async function joinQueue() {
    if (state.joining) return;
    state.joining = true;
    $("join-queue").disabled = true;
    try {
      await join();
    } finally {
      state.joining = false;
      updateButtons();
    }
  }

  async function join() {
    const id = state.voucherId;
    let answer = await S.call("POST", "/vouchers/" + id + "/queue", { token: token() });
    if (state.voucherId !== id) return;
    if (answer.status === 400 && answer.body && typeof answer.body.challenge === "string") {
      // The room asks for proof of work: solved here, then joined with it.
      S.say("This room asks for proof of work: solving it...", "");
      const nonce = await solveProof(answer.body.challenge, answer.body.proof_bits, id);
      if (nonce === null) return;
      answer = await S.call("POST", "/vouchers/" + id + "/queue", {
        token: token(),
        headers: { "X-Queue-Proof": nonce },
      });
      if (state.voucherId !== id) return;
    }
    if (answer.status !== 202) return refused(answer);
    S.say("You joined the waiting room.", "");
    queued(answer);
  }

  async function pollQueue() {
    const id = state.voucherId;
    const q = state.queue;
    if (!q) return;
    const answer = await S.call("GET", "/vouchers/" + id + "/queue", {
      token: token(),
      headers: { "X-Queue-Ticket": q.ticket },
    });
    if (state.voucherId !== id || state.queue !== q) return;
    if (answer.status !== 200) {
      refused(answer, true);
      if ([400, 401, 403, 404, 409].includes(answer.status)) {
        // The ticket is not (or no longer) good here, or the sale ended:
        // join again, where there is a sale to join.
        leaveQueue();
        return;
      }
      stopQueue();
      state.queueTimer = setTimeout(pollQueue, (answer.retryAfter || 2) * 1000);
      return;
    }
    S.recovered();
    queued(answer);
  }

  function admitted() {
    const q = state.queue;
    return Boolean(q && q.status === "admitted" && Date.parse(q.admitted_until) > S.clock.now());
  }

  // ---- the purchase ---------------------------------------------------

  function updateButtons() {
    const v = state.voucher;
    const buy = $("buy");
    if (!v) return;
    const p = phase(v, S.clock.now());
    let hint = "";
    if (!token()) hint = DEMO ? "Sign in to buy." : "Sign in with your token to buy.";
    else if (p.word === "coming") hint = "The button opens when the sale starts.";
    else if (p.word === "ended") hint = "The sale is over.";
    else if (v.waiting_room && !admitted()) hint = "Join the waiting room; you can buy once admitted.";
    else if (liveOrder()) hint = "You hold an order for this voucher.";
    else if (Date.now() < state.blockedUntil) hint = "Wait before trying again.";
    buy.disabled = hint !== "" || state.busy;
    $("buy-hint").textContent = hint;
    $("join-queue").disabled = !token() || p.word === "ended" || state.joining;
  }

  function quantity() {
    const value = Number.parseInt($("quantity").value, 10);
    if (!Number.isInteger(value) || value < 1) return 1;
    return Math.min(value, maxUnits());
  }

  // An error answer: its message, and what it changes on the page.
  // `background`: the page's own poll was refused, not a click.
  function refused(answer, background) {
    const said = S.sayError(answer, background);
    if (said.code === "rate_limited" || said.code === "unavailable") {
      state.blockedUntil = Date.now() + (answer.retryAfter || 1) * 1000;
      setTimeout(updateButtons, (answer.retryAfter || 1) * 1000 + 50);
    }
    if (said.code === "unauthorized") {
      sessionStorage.removeItem(TOKEN_KEY);
      showAccount();
    }
    updateButtons();
    return said;
  }

  async function buy(event) {
    event.preventDefault();
    const id = state.voucherId;
    const k = quantity();
    const headers = {};
    if (state.queue && state.queue.ticket) headers["X-Queue-Ticket"] = state.queue.ticket;
    state.busy = true;
    updateButtons();
    // No body for one unit: the service takes that as 1 (and a body is
    // only understood where units are sold).
    const answer = await S.call("POST", "/seckill/" + id, {
      token: token(),
      headers: headers,
      body: k > 1 ? { quantity: k } : undefined,
    });
    state.busy = false;
    if (state.voucherId !== id) return;
    if (answer.status === 200 || answer.status === 202) {
      S.say(answer.status === 202 ? "Accepted: your order is being stored." : "Bought.", "");
      setOrder({ order_id: answer.body.order_id, status: answer.body.status || "unpaid" });
      loadOrder();
    } else {
      const said = refused(answer);
      if (said.code === "not_admitted" && state.queue) {
        // The admission ran out (or the clocks disagree): ask the room now.
        stopQueue();
        pollQueue();
      }
      if (said.code === "already_purchased" && answer.body.order_id) {
        setOrder({ order_id: answer.body.order_id, status: "" });
        loadOrder();
      }
    }
    updateButtons();
    loadVoucher();
  }

  // ---- the order ------------------------------------------------------

  function stopOrder() {
    clearTimeout(state.orderTimer);
    state.orderTimer = null;
  }

  function setOrder(order) {
    state.order = order;
    if (order) sessionStorage.setItem(ORDER_KEY + state.voucherId, order.order_id);
    showOrder();
  }

  function showOrder() {
    const o = state.order;
    $("order").hidden = !o;
    if (!o) return;
    $("order-id").textContent = o.order_id;
    $("order-status").textContent = o.status;
    let detail = "";
    if (o.status === "pending") detail = "Accepted; being stored. This updates by itself.";
    else if (o.status === "unpaid" && o.pay_by)
      detail = "Pay before " + S.clockTime(Date.parse(o.pay_by) - S.clock.offset) + ", or it expires.";
    else if (o.status === "paid" && o.paid_at) detail = "Paid at " + S.clockTime(Date.parse(o.paid_at) - S.clock.offset) + ".";
    else if (o.status === "cancelled" || o.status === "expired") detail = "Its units went back on sale.";
    $("order-detail").textContent = detail;
    $("pay").hidden = !DEMO || !["pending", "unpaid"].includes(o.status);
    $("cancel").hidden = !["pending", "unpaid"].includes(o.status);
    updateButtons();
  }

  // Reads the order (the one bought here, kept for the tab), and again
  // while it is pending: an async sale stores it a moment later.
  async function loadOrder() {
    stopOrder();
    const id = state.voucherId;
    const orderId = (state.order && state.order.order_id) || sessionStorage.getItem(ORDER_KEY + id);
    if (!orderId || !token()) return;
    const answer = await S.call("GET", "/orders/" + orderId, { token: token() });
    if (state.voucherId !== id) return;
    if (answer.status === 200) {
      S.recovered();
      setOrder(answer.body);
      if (answer.body.status === "pending") state.orderTimer = setTimeout(loadOrder, ORDER_POLL_MS);
      else if (answer.body.status === "unpaid") {
        // Read again until it changes: sooner just after its payment's
        // deadline, when it expires; past it (the sweep expires it within
        // seconds) at the usual pace.
        const expires = answer.body.pay_by ? Date.parse(answer.body.pay_by) - S.clock.now() + 500 : 0;
        const wait = expires > 0 ? Math.min(UNPAID_POLL_MS, expires) : UNPAID_POLL_MS;
        state.orderTimer = setTimeout(loadOrder, Math.max(250, wait));
      }
    } else if (answer.status === 404) {
      sessionStorage.removeItem(ORDER_KEY + id);
      state.order = null;
      showOrder();
    } else {
      refused(answer, true);
      state.orderTimer = setTimeout(loadOrder, (answer.retryAfter || 1) * 1000);
    }
  }

  async function pay() {
    const o = state.order;
    if (!o) return;
    $("pay").disabled = true;
    const answer = await S.call("POST", "/demo/orders/" + o.order_id + "/pay", { token: token() });
    $("pay").disabled = false;
    if (answer.status !== 200) {
      refused(answer);
    } else if (answer.body.refund) {
      S.say("The order could not take this payment (" + answer.body.status + "): it is refunded.", "");
    } else {
      S.say("Paid.", "");
    }
    loadOrder();
  }

  async function cancel() {
    const o = state.order;
    if (!o) return;
    $("cancel").disabled = true;
    const answer = await S.call("POST", "/orders/" + o.order_id + "/cancel", { token: token() });
    $("cancel").disabled = false;
    if (answer.status !== 200) {
      refused(answer);
      // Paid or expired meanwhile: show what it is now.
      loadOrder();
    } else {
      S.say("Cancelled: the units went back on sale.", "");
      setOrder(answer.body);
    }
    loadVoucher();
  }

  // ---- where the page is ---------------------------------------------

  // `/shop/#/vouchers/{id}` or `/shop/vouchers/{id}`: that voucher;
  // anything else: the list.
  function route() {
    const fromHash = /^#\/vouchers\/(\d+)$/.exec(location.hash);
    const fromPath = /^\/shop\/vouchers\/(\d+)\/?$/.exec(location.pathname);
    const match = fromHash || (location.hash.length > 1 ? null : fromPath);
    const id = match ? Number(match[1]) : null;
    if (id !== state.voucherId) {
      stopQueue();
      stopOrder();
      state.queue = null;
      state.order = null;
      state.voucher = null;
      clearVoucher();
      showQueue();
      showOrder();
      S.say("", "");
    }
    state.voucherId = id;
    $("list-view").hidden = id !== null;
    $("voucher-view").hidden = id === null;
    if (id === null) {
      document.title = "Flash sale";
      loadList().then(renderList);
    } else {
      document.title = "Voucher " + id + " · Flash sale";
      loadVoucher().then(() => {
        loadOrder();
        resumeQueue();
      });
    }
  }

  // Another voucher's facts are not left on the page while this one loads
  // (or when it does not exist).
  function clearVoucher() {
    for (const id of ["v-title", "v-price", "v-stock", "v-countdown", "v-limits", "v-phase", "buy-hint"]) {
      $(id).textContent = "";
    }
    $("buy").disabled = true;
    $("room").hidden = true;
    $("quantity-box").hidden = true;
    $("quantity").value = "1";
  }

  // The ticket this tab holds for the voucher, if any: asked about at once.
  function resumeQueue() {
    const ticket = sessionStorage.getItem(QUEUE_KEY + state.voucherId);
    if (!ticket || state.queue || !state.voucher || !state.voucher.waiting_room || !token()) return;
    state.queue = { ticket: ticket, status: "waiting", place: null, serving: 0 };
    pollQueue();
  }

  // One refresh at a time: a slow answer is not asked for again meanwhile.
  function refresh() {
    if (state.refreshing) return;
    state.refreshing = true;
    const done = () => {
      state.refreshing = false;
    };
    (state.voucherId === null ? loadList().then(renderList) : loadVoucher()).then(done, done);
  }

  $("sign-in").addEventListener("click", demoSignIn);
  $("token-form").addEventListener("submit", pasteSignIn);
  $("sign-out").addEventListener("click", signOut);
  $("join-queue").addEventListener("click", joinQueue);
  $("buy-form").addEventListener("submit", buy);
  $("pay").addEventListener("click", pay);
  $("cancel").addEventListener("click", cancel);
  window.addEventListener("hashchange", route);
  setInterval(tick, 250);
  setInterval(refresh, REFRESH_MS);
  showAccount();
  route();
})();
