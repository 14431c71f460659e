// The potluck dashboard: fragment routing, the REST client, live updates
// from /rounds/stream (with polling fallback), the player's and the
// operator's views. No framework, no build step.
"use strict";
(function () {
  const $ = (id) => document.getElementById(id);
  // Script errors and CSP violations of this page load, for the curious
  // (and the browser tests, which require none).
  const pageErrors = [];
  window.addEventListener("error", (e) => pageErrors.push(String(e.message)));
  window.addEventListener("unhandledrejection", (e) => pageErrors.push(String(e.reason)));
  document.addEventListener("securitypolicyviolation",
    (e) => pageErrors.push(`CSP ${e.violatedDirective}: ${e.blockedURI}`));
  const SATS_PER_BTC = 100000000n;
  const TOKEN_KEY = "potluck.token";
  const LANG_KEY = "potluck.lang";

  const state = {
    // The session token lives as long as the browser tab (sessionStorage).
    token: sessionStorage.getItem(TOKEN_KEY),
    lang: localStorage.getItem(LANG_KEY) || (navigator.language || "en").slice(0, 2),
    // Server clock minus local clock, from the Date header: the countdown
    // runs on the server's time, not on a skewed local clock.
    skewMs: 0,
    me: null,
    round: null,
    watchedRound: null,
    reveal: null,
    auditBefore: null,
    live: "connecting",
    // Every change of the live state, for the curious (and the tests).
    liveHistory: [],
  };
  if (!window.PotluckI18n.languages.includes(state.lang)) state.lang = "en";
  // The admin token is never written anywhere: only this variable, which
  // stays inside this closure (not on the `Potluck` object below).
  let adminToken = null;

  // ---------- texts and amounts ----------

  function table() {
    return window.PotluckI18n.tables[state.lang] || window.PotluckI18n.tables.en;
  }

  /** Formats sats as "12,345 sats (0.00012345 BTC)". */
  function fmtSats(value) {
    let n;
    try {
      n = BigInt(value);
    } catch (_) {
      return String(value);
    }
    const neg = n < 0n;
    const abs = neg ? -n : n;
    const locale = state.lang === "de" ? "de-DE" : "en-US";
    const sats = new Intl.NumberFormat(locale).format(abs);
    const frac = (abs % SATS_PER_BTC).toString().padStart(8, "0");
    const sep = state.lang === "de" ? "," : ".";
    const btc = `${abs / SATS_PER_BTC}${sep}${frac}`;
    return `${neg ? "−" : ""}${sats} sats (${neg ? "−" : ""}${btc} BTC)`;
  }

  function interpolate(text, params) {
    return text.replace(/\{(\w+)\}/g, (whole, name) => {
      if (!params || !(name in params)) return whole;
      const v = params[name];
      return name.endsWith("_sats") ? fmtSats(v) : String(v);
    });
  }

  function t(key, params) {
    const text = table()[key] ?? window.PotluckI18n.tables.en[key] ?? key;
    return interpolate(text, params);
  }

  /**
   * The text of an API error: the client's own translation of `code`, or
   * the server's English `message` for a code it does not know (seed
   * "Errors" 3). Admin errors carry a bare string and are shown as sent.
   */
  function errorText(err) {
    if (err.code && table()["err_" + err.code]) return t("err_" + err.code, err.params || {});
    if (err.message) return err.message;
    return t("network_error");
  }

  function applyTexts() {
    document.documentElement.lang = state.lang;
    for (const el of document.querySelectorAll("[data-i18n]")) {
      el.textContent = t(el.dataset.i18n);
    }
    $("lang").value = state.lang;
  }

  // ---------- HTTP ----------

  class ApiError extends Error {
    constructor(status, detail) {
      const structured = detail && typeof detail === "object";
      super(structured ? detail.message : String(detail ?? ""));
      this.status = status;
      this.code = structured ? detail.code : null;
      this.params = structured ? detail.params || {} : {};
    }
  }

  async function api(method, path, body, opts = {}) {
    const headers = { Accept: "application/json" };
    if (body !== undefined) headers["Content-Type"] = "application/json";
    if (opts.admin) headers["X-Admin-Token"] = adminToken || "";
    else if (state.token && opts.auth !== false) headers.Authorization = "Bearer " + state.token;
    let res;
    try {
      res = await fetch(path, {
        method,
        headers,
        body: body === undefined ? undefined : JSON.stringify(body),
        cache: "no-store",
      });
    } catch (e) {
      throw new ApiError(0, { code: null, message: t("network_error"), params: {} });
    }
    const date = res.headers.get("Date");
    if (date) {
      const server = Date.parse(date);
      if (!Number.isNaN(server)) state.skewMs = server + 500 - Date.now();
    }
    let data = null;
    const text = await res.text();
    if (text) {
      try {
        data = JSON.parse(text);
      } catch (_) {
        data = null;
      }
    }
    if (!res.ok) {
      const err = new ApiError(res.status, data && data.detail !== undefined ? data.detail : res.statusText);
      // A dead session sends the player back to the login form, with the
      // reason, wherever it was noticed.
      if (!opts.admin && res.status === 401 && state.token &&
          ["session_expired", "invalid_token", "not_authenticated"].includes(err.code)) {
        endSession(errorText(err));
      }
      throw err;
    }
    return data;
  }

  // ---------- small DOM helpers ----------

  function show(el, on) {
    el.hidden = !on;
  }

  function setError(id, text) {
    const el = $(id);
    el.textContent = text || "";
    show(el, Boolean(text));
  }

  let noticeTimer = null;
  function notice(text, kind) {
    const el = $("notice");
    el.textContent = text;
    el.className = "banner " + (kind || "info");
    show(el, true);
    clearTimeout(noticeTimer);
    // A warning (a session that ended, a refused bet) stays until the next notice: a
    // player who looks back later still reads why.
    if (kind !== "warn") noticeTimer = setTimeout(() => show(el, false), 8000);
  }

  function el(tag, text, cls) {
    const e = document.createElement(tag);
    if (text !== undefined && text !== null) e.textContent = text;
    if (cls) e.className = cls;
    return e;
  }

  function parseSats(value) {
    const s = String(value).trim().replace(/[_,\s]/g, "");
    if (!/^\d+$/.test(s)) return null;
    const n = Number(s);
    return Number.isSafeInteger(n) ? n : null;
  }

  function shortTxid(txid) {
    return txid ? `${txid.slice(0, 10)}…${txid.slice(-6)}` : "–";
  }

  function statusText(s) {
    return s ? t("status_" + s) : "–";
  }

  // ---------- session ----------

  function setToken(token) {
    state.token = token;
    if (token) sessionStorage.setItem(TOKEN_KEY, token);
    else sessionStorage.removeItem(TOKEN_KEY);
  }

  function endSession(reason) {
    setToken(null);
    state.me = null;
    if (reason) notice(reason, "warn");
    route();
  }

  async function login(username, password) {
    const r = await api("POST", "/auth/login", { username, password }, { auth: false });
    setToken(r.access_token);
    await refresh();
    location.hash = "#/";
    route();
  }

  // ---------- live updates ----------

  const live = {
    source: null,
    backoffMs: 1000,
    retryTimer: null,
    pollTimer: null,
    refetchQueued: false,
  };

  function setLive(mode) {
    if (state.live !== mode) state.liveHistory.push(mode);
    state.live = mode;
    const e = $("live-status");
    e.dataset.state = mode;
    e.textContent = t("live_" + mode);
  }

  function startPolling() {
    if (live.pollTimer) return;
    live.pollTimer = setInterval(() => refresh(), 3000);
  }

  function stopPolling() {
    clearInterval(live.pollTimer);
    live.pollTimer = null;
  }

  /**
   * One EventSource at a time. Each `data: refetch` triggers a refetch. On a
   * 503 (cap reached) or a dropped stream the browser would either give up
   * or retry at its own pace: instead the page closes it, polls, and tries
   * the stream again with doubling back-off (1 s … 60 s).
   */
  function connectStream() {
    clearTimeout(live.retryTimer);
    if (live.source) live.source.close();
    const es = new EventSource("/rounds/stream");
    live.source = es;
    es.onopen = () => {
      live.backoffMs = 1000;
      stopPolling();
      setLive("live");
      refresh();
    };
    es.onmessage = () => scheduleRefetch();
    es.onerror = () => {
      es.close();
      if (live.source === es) live.source = null;
      setLive("polling");
      startPolling();
      refresh();
      live.retryTimer = setTimeout(connectStream, live.backoffMs);
      live.backoffMs = Math.min(live.backoffMs * 2, 60000);
    };
  }

  // Notifications come in bursts (a block, a status change, a deposit):
  // one refetch serves a burst.
  function scheduleRefetch() {
    if (live.refetchQueued) return;
    live.refetchQueued = true;
    setTimeout(() => {
      live.refetchQueued = false;
      refresh();
    }, 150);
  }

  // ---------- data ----------

  let refreshing = null;
  let refreshAgain = false;

  async function refresh() {
    if (refreshing) {
      refreshAgain = true;
      return refreshing;
    }
    refreshing = (async () => {
      try {
        await refreshOnce();
      } finally {
        refreshing = null;
      }
      if (refreshAgain) {
        refreshAgain = false;
        await refresh();
      }
    })();
    return refreshing;
  }

  async function refreshOnce() {
    const tasks = [loadRound()];
    if (state.token) tasks.push(loadMe(), loadTransactions(), loadLastResult());
    if (adminToken && currentView() === "admin") tasks.push(loadAdmin(false));
    if (currentView() === "rounds") tasks.push(loadRounds());
    await Promise.allSettled(tasks);
  }

  async function loadRound() {
    let round;
    try {
      round = await api("GET", "/rounds/current");
    } catch (_) {
      return;
    }
    const previous = state.watchedRound;
    state.round = round;
    show($("paused-banner"), Boolean(round.paused));
    renderRound();
    // A round this page watched has moved on (its draw ended it, or a new
    // one opened): fetch it and show its reveal.
    if (previous && previous.id !== round.id) {
      try {
        const done = await api("GET", `/rounds/${previous.id}`);
        if (done.draw || previous.pot_sats > 0) state.reveal = done;
      } catch (_) {
        /* the reveal stays as it was */
      }
    } else if (round.draw && round.status !== "open") {
      state.reveal = round;
    } else if (state.reveal && state.reveal.id === round.id) {
      state.reveal = round;
    } else if (state.reveal && !settled(state.reveal)) {
      // The revealed round's payout goes on after the next round opened:
      // follow it until it is confirmed.
      try {
        state.reveal = await api("GET", `/rounds/${state.reveal.id}`);
      } catch (_) {
        /* keep what is shown */
      }
    }
    state.watchedRound = round;
    renderReveal();
  }

  function settled(r) {
    return r.status === "closed" && (!r.payout || ["confirmed", "broadcast_failed"].includes(r.payout.status));
  }

  async function loadMe() {
    try {
      state.me = await api("GET", "/users/me");
    } catch (_) {
      return;
    }
    renderMe();
  }

  async function loadTransactions() {
    let data;
    try {
      data = await api("GET", "/users/me/transactions");
    } catch (_) {
      return;
    }
    const list = Array.isArray(data) ? data : data.transactions || data.items || [];
    const body = $("tx-list");
    body.replaceChildren();
    for (const tx of list) {
      const tr = el("tr");
      tr.dataset.kind = tx.kind || tx.type || "";
      tr.dataset.status = tx.status || "";
      const kind = tx.kind || tx.type || "";
      tr.append(
        el("td", t("kind_" + kind) === "kind_" + kind ? kind : t("kind_" + kind)),
        el("td", tx.amount_sats !== undefined ? fmtSats(tx.amount_sats) : "–", "num"),
        el("td", statusText(tx.status)),
      );
      const td = el("td", null, "mono");
      if (tx.txid) {
        const code = el("code", shortTxid(tx.txid));
        code.title = tx.txid;
        code.dataset.txid = tx.txid;
        td.append(code);
      } else {
        td.textContent = "–";
      }
      tr.append(td);
      body.append(tr);
    }
    show($("tx-empty"), list.length === 0);
  }

  async function loadLastResult() {
    let r;
    try {
      r = await api("GET", "/users/me/last-round-result");
    } catch (e) {
      if (e.code === "no_round_played") show($("last-result"), false);
      return;
    }
    const box = $("last-result");
    box.dataset.roundId = r.round_id;
    box.dataset.outcome = r.outcome;
    $("last-round-id").textContent = "#" + r.round_id;
    $("last-outcome").textContent = t("outcome_" + r.outcome, r);
    $("last-amounts").textContent = t("bet_and_won", { bet_sats: r.bet_sats ?? 0, won_sats: r.won_sats ?? 0 });
    $("last-verify").href = `#/verify/${r.round_id}`;
    show(box, true);
  }

  // ---------- rendering: player ----------

  // The server draws the QR code (GET /users/me/deposit-qr.svg); it is
  // parsed as SVG, never as HTML, and only replaces the box if the address
  // shown is still the one it encodes.
  async function loadDepositQr(address) {
    let res;
    try {
      res = await fetch("/users/me/deposit-qr.svg", {
        headers: { Authorization: "Bearer " + state.token },
        cache: "no-store",
      });
    } catch (_) {
      return;
    }
    if (!res.ok || $("address").textContent !== address) return;
    const doc = new DOMParser().parseFromString(await res.text(), "image/svg+xml");
    const svg = doc.documentElement;
    if (svg.nodeName !== "svg") return;
    $("qr").replaceChildren(document.importNode(svg, true));
  }

  function renderMe() {
    const me = state.me;
    if (!me) return;
    $("whoami").textContent = me.username;
    show($("whoami"), true);
    if ($("address").textContent !== me.address) {
      $("address").textContent = me.address;
      loadDepositQr(me.address);
    }
    $("balance").textContent = fmtSats(me.balance_sats);
    $("balance").dataset.sats = me.balance_sats;
    $("pending-balance").textContent = fmtSats(me.pending_balance_sats);
    $("pending-balance").dataset.sats = me.pending_balance_sats;
    show($("pending-indicator"), Boolean(me.has_pending));
    // The faucet exists only on the development chain (regtest addresses).
    show($("faucet-btn"), /^bcrt1/.test(me.address || ""));
  }

  function renderRound() {
    const r = state.round;
    if (!r) return;
    $("round-id").textContent = "#" + r.id;
    $("round-card").dataset.roundId = r.id;
    const st = $("round-status");
    st.textContent = statusText(r.status);
    st.dataset.status = r.status;
    $("pot").textContent = fmtSats(r.pot_sats);
    $("pot").dataset.sats = r.pot_sats;
    $("bettors").textContent = String(r.bettors);
    show($("you-played"), Boolean(r.user_played));
    show($("bet-form"), Boolean(state.token));
    const canBet = r.status === "open" && !r.paused && Boolean(state.token);
    $("bet-btn").disabled = !canBet;
    tick();
  }

  /** The countdown: server time from the Date header, anchored to `closes_at`. */
  function tick() {
    const r = state.round;
    const c = $("countdown");
    if (!r) return;
    const closes = Date.parse(r.closes_at);
    const left = Math.max(0, closes - (Date.now() + state.skewMs));
    c.dataset.secondsLeft = String(Math.ceil(left / 1000));
    if (r.status !== "open") {
      c.textContent = statusText(r.status);
      return;
    }
    const s = Math.ceil(left / 1000);
    const h = Math.floor(s / 3600);
    const m = Math.floor((s % 3600) / 60);
    const sec = String(s % 60).padStart(2, "0");
    c.textContent = h > 0 ? `${h}:${String(m).padStart(2, "0")}:${sec}` : `${m}:${sec}`;
    // At zero the server moves the round on; ask for it even if a
    // notification was missed.
    if (left === 0 && !tick.asked) {
      tick.asked = true;
      setTimeout(() => {
        tick.asked = false;
        refresh();
      }, 1000);
    }
  }

  function renderReveal() {
    const r = state.reveal;
    const box = $("reveal");
    if (!r) {
      show(box, false);
      return;
    }
    const d = r.draw || {};
    box.dataset.roundId = r.id;
    box.dataset.status = r.status;
    $("reveal-round").textContent = "#" + r.id;
    let phase;
    if (!r.draw && r.pot_sats === 0) phase = t("phase_no_bets");
    else if (r.status === "drawing" || (r.draw && !d.block_hash)) {
      phase = t("phase_drawing", { height: d.tip_height_at_close != null ? d.tip_height_at_close + 1 : "?" });
    } else phase = t("phase_" + r.status);
    $("reveal-phase").textContent = phase;
    const winner = d.winner ? d.winner.username : "…";
    $("reveal-winner").textContent = winner;
    $("reveal-winner").dataset.username = d.winner ? d.winner.username : "";
    $("reveal-ticket").textContent = d.ticket != null ? String(d.ticket) : "…";
    $("reveal-pot").textContent = fmtSats(r.pot_sats);
    $("reveal-block").textContent = d.block_hash ? `${d.block_height} · ${d.block_hash}` : "…";
    const p = r.payout;
    $("reveal-payout").textContent = p
      ? `${fmtSats(p.winner_sats ?? 0)} · ${statusText(p.status)} · ${p.txid || "–"}`
      : "…";
    $("verify-link").href = `#/verify/${r.id}`;
    show($("verify-link"), Boolean(d.block_hash));
    show(box, true);
  }

  // ---------- rendering: rounds and verify ----------

  async function loadRounds() {
    let data;
    try {
      data = await api("GET", "/rounds?limit=20");
    } catch (_) {
      return;
    }
    const list = Array.isArray(data) ? data : data.rounds || data.items || [];
    const body = $("rounds-list");
    body.replaceChildren();
    for (const r of list) {
      const tr = el("tr");
      const a = el("a", t("verify"));
      a.href = `#/verify/${r.id}`;
      tr.append(
        el("td", "#" + r.id),
        el("td", statusText(r.status)),
        el("td", fmtSats(r.pot_sats), "num"),
        el("td", String(r.bettors)),
        el("td", r.draw && r.draw.winner ? r.draw.winner.username : "–"),
      );
      const td = el("td");
      if (r.draw && r.draw.block_hash) td.append(a);
      tr.append(td);
      body.append(tr);
    }
  }

  async function showVerify(id) {
    $("verify-round").textContent = "#" + id;
    const result = $("verify-result");
    result.textContent = "…";
    delete result.dataset.ok;
    $("verify-checks").replaceChildren();
    $("verify-ranges").replaceChildren();
    $("verify-block-hint").textContent = "";
    let round;
    try {
      round = await api("GET", `/rounds/${encodeURIComponent(id)}`);
    } catch (e) {
      result.textContent = errorText(e);
      return;
    }
    let v;
    try {
      v = await window.PotluckDraw.verify(round);
    } catch (_) {
      result.textContent = t("verify_pending");
      return;
    }
    result.dataset.ok = String(v.ok);
    result.textContent = v.ok ? t("verified_ok") : t("verified_bad");
    result.className = "big " + (v.ok ? "ok" : "error");
    for (const c of v.checks) {
      const tr = el("tr");
      tr.dataset.check = c.name;
      tr.dataset.ok = String(c.ok);
      tr.append(
        el("td", c.ok === false ? "✗" : "✓", c.ok === false ? "error" : "ok"),
        el("td", c.name),
        el("td", String(c.got), "mono break"),
      );
      $("verify-checks").append(tr);
    }
    for (const r of v.ranges) {
      const tr = el("tr");
      if (v.winner && r.bet_id === v.winner.bet_id) tr.className = "winner";
      tr.append(
        el("td", String(r.bet_id)),
        el("td", r.username),
        el("td", fmtSats(r.end - r.start), "num"),
        el("td", `[${r.start}, ${r.end})`, "mono"),
      );
      $("verify-ranges").append(tr);
    }
    const d = round.draw;
    $("verify-block-hint").textContent = t("verify_block_hint", { height: d.block_height, hash: d.block_hash });
  }

  // ---------- admin ----------

  const CONFIG_FIELDS = [
    "fee_address", "fee_rate_sat_vb", "round_duration_seconds",
    "min_bet_sats", "min_withdrawal_sats", "deposit_confirmations",
  ];

  function adminError(e) {
    // Admin errors are bare strings (seed "Errors" 5): shown as sent.
    return e.code ? errorText(e) : e.message || t("network_error");
  }

  async function loadAdmin(renderForm) {
    const config = await api("GET", "/admin/config", undefined, { admin: true });
    state.adminConfig = config;
    $("admin-paused-state").textContent = config.paused ? t("state_paused") : t("state_running");
    $("admin-paused-state").dataset.paused = String(Boolean(config.paused));
    $("pause-btn").disabled = Boolean(config.paused);
    $("resume-btn").disabled = !config.paused;
    if (renderForm) renderConfigForm(config);
    await loadAudit(true);
    await loadWaitingTransfers();
  }

  /**
   * Withdrawals and payouts broadcast and not yet confirmed, with the blocks
   * each has waited and its versions (fee bumps); stuck ones stand out.
   */
  async function loadWaitingTransfers() {
    let list;
    try {
      list = await api("GET", "/admin/transfers/waiting", undefined, { admin: true });
    } catch (_) {
      return;
    }
    const items = list.map((w) => {
      const li = el("li", t("waiting_line", {
        id: w.transfer_id, kind: w.kind, amount: fmtSats(w.amount_sats), fee: fmtSats(w.fee_sats),
        blocks: w.blocks_waiting ?? "–", versions: w.versions,
      }), "mono");
      li.dataset.transferId = w.transfer_id;
      return li;
    });
    $("waiting-transfers").replaceChildren(...items);
    show($("waiting-transfers-empty"), items.length === 0);
  }

  function renderConfigForm(config) {
    const box = $("config-fields");
    box.replaceChildren();
    const names = CONFIG_FIELDS.concat(Object.keys(config).filter(
      (k) => !CONFIG_FIELDS.includes(k) && k !== "paused"));
    for (const name of names) {
      if (!(name in config)) continue;
      const label = el("label");
      const input = el("input");
      input.id = "cfg-" + name;
      input.name = name;
      input.value = config[name] ?? "";
      input.dataset.original = String(config[name] ?? "");
      input.spellcheck = false;
      label.append(el("span", name, "mono"), input);
      const hint = el("p", "", "hint mono");
      if (name.endsWith("_sats")) {
        const upd = () => {
          const n = parseSats(input.value);
          hint.textContent = n === null ? "" : fmtSats(n);
        };
        input.addEventListener("input", upd);
        upd();
      }
      const err = el("p", "", "error");
      err.id = "cfg-error-" + name;
      err.hidden = true;
      err.setAttribute("role", "alert");
      box.append(label, hint, err);
    }
  }

  async function saveConfig(ev) {
    ev.preventDefault();
    setError("config-error", "");
    show($("config-saved"), false);
    for (const e of document.querySelectorAll("#config-fields .error")) setError(e.id, "");
    const patch = {};
    for (const input of document.querySelectorAll("#config-fields input")) {
      if (input.value === input.dataset.original) continue;
      const original = state.adminConfig[input.name];
      if (typeof original === "number") {
        const v = input.value.trim();
        // Send what was typed when it is not a number, so the server's
        // rule text (naming the field) is what the operator sees.
        patch[input.name] = /^-?\d+$/.test(v) ? Number(v) : v;
      } else {
        patch[input.name] = input.value.trim();
      }
    }
    if (Object.keys(patch).length === 0) {
      setError("config-error", t("no_changes"));
      return;
    }
    try {
      const config = await api("PUT", "/admin/config", patch, { admin: true });
      state.adminConfig = config;
      renderConfigForm(config);
      show($("config-saved"), true);
      await loadAudit(true);
    } catch (e) {
      const text = adminError(e);
      // The service's text starts with the field it refuses.
      const field = Object.keys(patch).find((k) => text.startsWith(k + " ") || text.startsWith(k + ":"));
      if (field) setError("cfg-error-" + field, text);
      else setError("config-error", text);
    }
  }

  async function loadAudit(reset) {
    const before = reset ? null : state.auditBefore;
    const q = before ? `?limit=50&before_id=${before}` : "?limit=50";
    const data = await api("GET", "/admin/audit" + q, undefined, { admin: true });
    const body = $("audit-list");
    if (reset) body.replaceChildren();
    for (const e of data.entries || []) {
      const tr = el("tr");
      tr.dataset.event = e.event;
      tr.dataset.id = e.id;
      const changes = el("td");
      for (const [field, ch] of Object.entries(e.diff || {})) {
        const line = el("div", null, "diff");
        line.dataset.field = field;
        line.append(el("span", field + ": ", "mono"), el("del", JSON.stringify(ch.before)),
          el("span", " → "), el("ins", JSON.stringify(ch.after)));
        changes.append(line);
      }
      if (e.details && Object.keys(e.details).length) {
        changes.append(el("div", JSON.stringify(e.details), "hint mono break"));
      }
      tr.append(el("td", String(e.id)), el("td", e.at, "mono"), el("td", e.event), el("td", e.actor), changes);
      body.append(tr);
    }
    state.auditBefore = data.next_before_id ?? null;
    show($("audit-more"), state.auditBefore !== null);
    if (reset) await loadPayoutFailures(data.entries || []);
  }

  /**
   * Rounds waiting for the operator: a `payout_failed` audit entry whose
   * round has no broadcast payout yet.
   */
  async function loadPayoutFailures(entries) {
    const ids = [...new Set(entries.filter((e) => e.event === "payout_failed")
      .map((e) => (e.details && (e.details.round_id ?? e.details.round)) ?? null)
      .filter((id) => id !== null))];
    // Built off the page and swapped in at the end, so that a refresh never
    // shows an empty list (or removes a button under the operator's click)
    // while it waits for the rounds.
    const items = [];
    for (const id of ids) {
      let round;
      try {
        round = await api("GET", `/rounds/${id}`);
      } catch (_) {
        continue;
      }
      const p = round.payout;
      const waiting = round.status === "payout_failed" ||
        (p && (p.status === "broadcast_failed" || p.status === "failed")) ||
        (round.status === "paying_out" && !(p && p.txid));
      if (!waiting) continue;
      const li = el("li");
      li.dataset.roundId = id;
      const btn = el("button", t("retry_payout"));
      btn.type = "button";
      btn.addEventListener("click", async () => {
        btn.disabled = true;
        try {
          await api("POST", `/admin/rounds/${id}/retry-payout`, {}, { admin: true });
          notice(t("retried", { round_id: id }), "ok");
          await loadAudit(true);
        } catch (e) {
          setError("admin-action-error", adminError(e));
          btn.disabled = false;
        }
      });
      li.append(el("span", `#${id} · ${fmtSats(round.pot_sats)} · ${statusText(round.status)} `), btn);
      items.push(li);
    }
    $("payout-failures").replaceChildren(...items);
    show($("payout-failures-empty"), items.length === 0);
  }

  async function adminAction(path) {
    setError("admin-action-error", "");
    try {
      await api("POST", path, {}, { admin: true });
      await loadAdmin(false);
      refresh();
    } catch (e) {
      setError("admin-action-error", adminError(e));
    }
  }

  // ---------- routing ----------

  function currentView() {
    const h = location.hash.replace(/^#\/?/, "");
    if (h.startsWith("verify/")) return "verify";
    if (h === "rounds") return "rounds";
    if (h === "admin") return "admin";
    return state.token ? "play" : "auth";
  }

  function route() {
    const view = currentView();
    for (const s of document.querySelectorAll(".view")) show(s, s.id === "view-" + view);
    show($("round-section"), view === "play" || view === "auth");
    show($("account-card"), view === "play");
    show($("logout-btn"), Boolean(state.token));
    if (!state.token) show($("whoami"), false);
    for (const a of document.querySelectorAll("header nav a")) {
      a.classList.toggle("active", a.getAttribute("href") === "#/" + (view === "play" || view === "auth" ? "" : view));
    }
    if (view === "verify") showVerify(location.hash.split("/")[2] || "");
    if (view === "rounds") loadRounds();
    if (view === "admin") {
      show($("admin-login"), !adminToken);
      show($("admin-panel"), Boolean(adminToken));
    }
    if (view === "play") refresh();
  }

  // ---------- wiring ----------

  function wire() {
    $("lang").addEventListener("change", () => {
      state.lang = $("lang").value;
      localStorage.setItem(LANG_KEY, state.lang);
      applyTexts();
      setLive(state.live);
      renderRound();
      renderMe();
      renderReveal();
      refresh();
    });

    $("login-form").addEventListener("submit", async (ev) => {
      ev.preventDefault();
      setError("login-error", "");
      const username = $("login-username").value;
      const password = $("login-password").value;
      if (!username || !password) return setError("login-error", t("required"));
      try {
        await login(username, password);
        $("login-password").value = "";
      } catch (e) {
        setError("login-error", errorText(e));
      }
    });

    $("register-form").addEventListener("submit", async (ev) => {
      ev.preventDefault();
      setError("register-error", "");
      const username = $("register-username").value;
      const password = $("register-password").value;
      try {
        const r = await api("POST", "/auth/register", { username, password }, { auth: false });
        notice(t("registered", { username: r.username }), "ok");
        await login(username, password);
        $("register-password").value = "";
      } catch (e) {
        setError("register-error", errorText(e));
      }
    });

    $("logout-btn").addEventListener("click", () => {
      endSession(t("logged_out"));
      location.hash = "#/";
    });

    $("password-form").addEventListener("submit", async (ev) => {
      ev.preventDefault();
      setError("password-error", "");
      const current = $("current-password").value;
      const next = $("new-password").value;
      if (!current || !next) return setError("password-error", t("required"));
      try {
        // The answer is a fresh token: this session goes on, the others end.
        const r = await api("POST", "/users/me/change-password",
          { current_password: current, new_password: next });
        setToken(r.access_token);
        $("current-password").value = "";
        $("new-password").value = "";
        notice(t("password_changed"), "ok");
      } catch (e) {
        setError("password-error", errorText(e));
      }
    });

    $("copy-address").addEventListener("click", async () => {
      try {
        await navigator.clipboard.writeText($("address").textContent);
        notice(t("copied"), "ok");
      } catch (_) {
        /* clipboard needs permission; the address is selectable anyway */
      }
    });

    const preview = (input, out) => input.addEventListener("input", () => {
      const n = parseSats(input.value);
      $(out).textContent = n === null ? "" : fmtSats(n);
    });
    preview($("bet-amount"), "bet-preview");
    preview($("withdraw-amount"), "withdraw-preview");

    $("bet-form").addEventListener("submit", async (ev) => {
      ev.preventDefault();
      setError("bet-error", "");
      const amount = parseSats($("bet-amount").value);
      if (amount === null || amount === 0) return setError("bet-error", t("whole_sats"));
      try {
        await api("POST", "/rounds/current/bets", { amount_sats: amount });
        notice(t("bet_placed", { amount_sats: amount }), "ok");
        $("bet-amount").value = "";
        $("bet-preview").textContent = "";
        refresh();
      } catch (e) {
        setError("bet-error", errorText(e));
      }
    });

    $("faucet-btn").addEventListener("click", async () => {
      const btn = $("faucet-btn");
      btn.disabled = true;
      try {
        const r = await api("POST", "/dev/faucet", {});
        const out = $("faucet-result");
        out.textContent = t("faucet_done", r);
        show(out, true);
        refresh();
      } catch (e) {
        notice(errorText(e), "warn");
      } finally {
        btn.disabled = false;
      }
    });

    $("withdraw-form").addEventListener("submit", async (ev) => {
      ev.preventDefault();
      for (const id of ["withdraw-address-error", "withdraw-amount-error", "withdraw-error"]) setError(id, "");
      show($("withdraw-result"), false);
      const address = $("withdraw-address").value.trim();
      const amount = parseSats($("withdraw-amount").value);
      let bad = false;
      if (!address) {
        setError("withdraw-address-error", t("required"));
        bad = true;
      }
      if (amount === null || amount === 0) {
        setError("withdraw-amount-error", t("whole_sats"));
        bad = true;
      }
      if (bad) return;
      try {
        const r = await api("POST", "/users/me/withdrawals", { address, amount_sats: amount });
        const out = $("withdraw-result");
        out.textContent = t("withdrawal_sent", { txid: r.txid || "–" });
        show(out, true);
        refresh();
      } catch (e) {
        // Address problems go under the address field, amount problems
        // under the amount, anything else under the form.
        const where = `${e.code || ""} ${(e.params && e.params.field) || ""}`;
        if (/address|network/.test(where)) setError("withdraw-address-error", errorText(e));
        else if (/amount|sats|funds|balance|dust|small/.test(where)) setError("withdraw-amount-error", errorText(e));
        else setError("withdraw-error", errorText(e));
      }
    });

    $("admin-login").addEventListener("submit", async (ev) => {
      ev.preventDefault();
      setError("admin-login-error", "");
      adminToken = $("admin-token").value;
      $("admin-token").value = "";
      try {
        await loadAdmin(true);
        show($("admin-login"), false);
        show($("admin-panel"), true);
      } catch (e) {
        adminToken = null;
        setError("admin-login-error", adminError(e));
      }
    });
    $("admin-lock").addEventListener("click", () => {
      adminToken = null;
      state.adminConfig = null;
      $("audit-list").replaceChildren();
      $("config-fields").replaceChildren();
      route();
    });
    $("config-form").addEventListener("submit", saveConfig);
    $("pause-btn").addEventListener("click", () => adminAction("/admin/pause"));
    $("resume-btn").addEventListener("click", () => adminAction("/admin/resume"));
    $("audit-more").addEventListener("click", () => loadAudit(false).catch((e) => setError("admin-action-error", adminError(e))));

    window.addEventListener("hashchange", route);
  }

  function start() {
    applyTexts();
    wire();
    setLive("connecting");
    route();
    refresh();
    connectStream();
    setInterval(tick, 250);
    // The audit log and failed payouts change without a stream notification
    // (a refused broadcast): the open admin view refreshes itself.
    setInterval(() => {
      if (adminToken && currentView() === "admin") loadAdmin(false).catch(() => {});
    }, 5000);
  }

  // For the browser tests and the curious: the pure parts.
  window.Potluck = { fmtSats, errorText, t, state, errors: pageErrors };

  start();
})();
