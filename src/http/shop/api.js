// What both pages share: calls to the API, the words for every error
// code of the contract, the server's clock, and the message line.
"use strict";

window.Seckill = (function () {
  // Every error code of the contract, as a buyer or an operator reads it.
  // `{retry}` is the wait that Retry-After gives, `{stock}` the units left.
  const MESSAGES = {
    bad_request: "The request was refused as malformed: {detail}",
    unauthorized: "Sign in first: the token is missing, expired or not valid.",
    forbidden: "This needs a valid admin token.",
    not_admitted:
      "Not admitted yet: join the waiting room and buy once your place is served.",
    not_found: "Not found: no such voucher or order.",
    method_not_allowed: "The service does not take this request.",
    payload_too_large: "The request was too large.",
    not_started: "The sale has not started yet.",
    ended: "The sale is over.",
    sold_out: "Sold out: no units left.",
    not_enough_stock: "Not that many left: only {stock} remain.",
    already_purchased: "You already hold an order for this voucher.",
    already_paid: "This order is paid: it cannot be cancelled.",
    order_expired: "This order expired unpaid: its units went back on sale.",
    order_pending: "The order is still being stored: try again in {retry} s.",
    too_many_orders:
      "You have made as many orders of this voucher as one buyer may.",
    payment_conflict: "This payment was recorded for another order.",
    purchase_in_progress: "Your purchase is already on its way.",
    rate_limited: "Too many requests: try again in {retry} s (at {at}).",
    unavailable: "The service is busy or cannot reach its storage: try again in {retry} s.",
    internal: "Something went wrong on the server.",
    network: "The service cannot be reached: check the connection.",
  };

  // The server's clock, as the browser can know it: the offset of the
  // server's time against this browser's, measured on an answer that
  // carries `server_time`. One answer bounds the offset between
  // `server - receivedAt` and `server - sentAt`; the middle of the
  // narrowest bound (the shortest round trip) is kept. A later answer
  // replaces it when its round trip is as short or shorter, or when the
  // kept offset falls outside its bound: one of the clocks was set since.
  const clock = {
    offset: 0,
    synced: false,
    roundTrip: Infinity,
    now() {
      return Date.now() + this.offset;
    },
    sync(serverTime, sentAt, receivedAt) {
      const server = Date.parse(serverTime);
      if (Number.isNaN(server) || !(receivedAt >= sentAt)) return;
      const roundTrip = receivedAt - sentAt;
      // `server_time` is given to the millisecond: one more of slack.
      const consistent =
        this.offset >= server - receivedAt - 1 && this.offset <= server - sentAt + 1;
      if (this.synced && consistent && roundTrip > this.roundTrip) return;
      this.offset = server - (sentAt + receivedAt) / 2;
      this.roundTrip = roundTrip;
      this.synced = true;
    },
  };

  function retryAfter(headers) {
    const value = headers && headers.get("Retry-After");
    const seconds = Number.parseInt(value || "", 10);
    return Number.isFinite(seconds) && seconds >= 0 ? seconds : null;
  }

  // One call: `{status, body, retryAfter, sentAt, receivedAt}`; a network
  // failure is status 0 with the error `network`.
  async function call(method, path, options) {
    const opts = options || {};
    const headers = Object.assign({ Accept: "application/json" }, opts.headers || {});
    if (opts.token) headers.Authorization = "Bearer " + opts.token;
    const init = { method: method, headers: headers, cache: opts.cache || "no-store" };
    if (opts.body !== undefined) {
      headers["Content-Type"] = "application/json";
      init.body = JSON.stringify(opts.body);
    }
    const sentAt = Date.now();
    let response;
    try {
      response = await fetch(path, init);
    } catch (e) {
      return {
        status: 0,
        body: { error: "network", message: String(e) },
        retryAfter: null,
        sentAt: sentAt,
        receivedAt: Date.now(),
      };
    }
    const receivedAt = Date.now();
    let body = null;
    try {
      body = await response.json();
    } catch (e) {
      body = null;
    }
    // Every answer of the service to these calls is a JSON object; a
    // success that is not one came from something in between (a captive
    // portal, a proxy's page): the service was not reached.
    if (response.ok && (body === null || typeof body !== "object")) {
      return {
        status: 0,
        body: { error: "network", message: "HTTP " + response.status + " without the service's answer" },
        retryAfter: null,
        sentAt: sentAt,
        receivedAt: receivedAt,
      };
    }
    return {
      status: response.status,
      body: body,
      retryAfter: retryAfter(response.headers),
      sentAt: sentAt,
      receivedAt: receivedAt,
    };
  }

  function pad(n) {
    return String(n).padStart(2, "0");
  }

  // A wait as `H:MM:SS` (days first when there are any), rounded up to
  // the second: it reads 0:00:00 only once the moment has come.
  function duration(ms) {
    let s = Math.max(0, Math.ceil(ms / 1000));
    const days = Math.floor(s / 86400);
    s -= days * 86400;
    const h = Math.floor(s / 3600);
    const m = Math.floor((s % 3600) / 60);
    const text = h + ":" + pad(m) + ":" + pad(s % 60);
    return days > 0 ? days + " d " + text : text;
  }

  function clockTime(ms) {
    const d = new Date(ms);
    return pad(d.getHours()) + ":" + pad(d.getMinutes()) + ":" + pad(d.getSeconds());
  }

  // The words for an error answer.
  function describe(answer) {
    const body = answer.body || {};
    const code = body.error || (answer.status ? "internal" : "network");
    const retry = answer.retryAfter === null ? 1 : answer.retryAfter;
    const template = MESSAGES[code] || body.message || "Refused: " + code;
    // Replaced by functions: a `$` in the server's text is not a pattern.
    const text = template
      .replace("{detail}", () => body.message || "")
      .replace("{retry}", () => String(retry))
      .replace("{at}", () => clockTime(Date.now() + retry * 1000))
      .replace("{stock}", () => (body.stock === undefined ? "a few units" : unitsText(body.stock)));
    return { code: code, text: text };
  }

  // The message line: the last error (`data-error` = its code) or notice.
  // An error of a read the page makes on its own (`background`: the
  // refresh every few seconds) is marked so, and the next such read that
  // succeeds takes it away (`recovered`); what the buyer's own actions
  // were told stays until the next one.
  function say(text, code, background) {
    const line = document.querySelector('[data-testid="message"]');
    if (!line) return;
    // A background error does not hide what a click was refused.
    if (background && line.dataset.background === "false" && line.dataset.error) return;
    line.textContent = text;
    line.dataset.error = code || "";
    line.dataset.background = background ? "true" : "false";
    line.classList.toggle("error", Boolean(code));
  }

  function sayError(answer, background) {
    const described = describe(answer);
    say(described.text, described.code, background);
    return described;
  }

  function recovered() {
    const line = document.querySelector('[data-testid="message"]');
    if (line && line.dataset.background === "true") say("", "");
  }

  // Writes `text` into the element `id` only when it changes: a live
  // region is not told again, a countdown not redrawn for nothing.
  function setText(id, text) {
    const node = document.getElementById(id);
    if (node.textContent !== text) node.textContent = text;
  }

  // "1 unit", "3 units".
  function unitsText(n) {
    return n + (n === 1 ? " unit" : " units");
  }

  function money(cents) {
    if (!cents) return "free";
    return (cents / 100).toFixed(2);
  }

  return {
    MESSAGES: MESSAGES,
    clock: clock,
    call: call,
    duration: duration,
    clockTime: clockTime,
    describe: describe,
    say: say,
    sayError: sayError,
    recovered: recovered,
    setText: setText,
    money: money,
    unitsText: unitsText,
  };
})();
