// Recomputes a round's draw in the browser from what the round publishes
// (DESIGN §4, §4.1): the bets commitment, the seed, the ticket and the winner.
"use strict";
(function () {
  const enc = new TextEncoder();

  function hexToBytes(hex) {
    if (typeof hex !== "string" || hex.length % 2 !== 0 || !/^[0-9a-fA-F]*$/.test(hex)) {
      throw new Error("not hex: " + hex);
    }
    const out = new Uint8Array(hex.length / 2);
    for (let i = 0; i < out.length; i++) out[i] = parseInt(hex.substr(i * 2, 2), 16);
    return out;
  }

  function bytesToHex(bytes) {
    return Array.from(new Uint8Array(bytes), (b) => b.toString(16).padStart(2, "0")).join("");
  }

  async function sha256(bytes) {
    return new Uint8Array(await crypto.subtle.digest("SHA-256", bytes));
  }

  function u64be(n) {
    const out = new Uint8Array(8);
    let x = BigInt(n);
    for (let i = 7; i >= 0; i--) {
      out[i] = Number(x & 0xffn);
      x >>= 8n;
    }
    return out;
  }

  function concat(...parts) {
    const out = new Uint8Array(parts.reduce((n, p) => n + p.length, 0));
    let pos = 0;
    for (const p of parts) {
      out.set(p, pos);
      pos += p.length;
    }
    return out;
  }

  /**
   * Verifies `round` (the JSON of GET /rounds/{id}). Returns
   * `{ok, checks: [{name, ok, expected, got}], commitment, seed, ticket,
   * ranges, winner}`; throws only when the round carries no complete draw.
   */
  async function verify(round) {
    const draw = round && round.draw;
    if (!draw || !draw.block_hash || !draw.bets_commitment || !Array.isArray(draw.bets)) {
      throw new Error("the round has no complete draw yet");
    }
    const bets = draw.bets.slice().sort((a, b) => {
      const x = BigInt(a.bet_id);
      const y = BigInt(b.bet_id);
      return x < y ? -1 : x > y ? 1 : 0;
    });
    const lines = bets
      .map((b) => `${b.bet_id}:${b.username}:${b.amount_sats}:${String(b.txid).toLowerCase()}\n`)
      .join("");
    const commitment = bytesToHex(await sha256(enc.encode(lines)));
    const seedBytes = await sha256(concat(
      hexToBytes(draw.block_hash),
      u64be(round.id),
      hexToBytes(commitment),
    ));
    const seed = bytesToHex(seedBytes);
    const pot = bets.reduce((n, b) => n + BigInt(b.amount_sats), 0n);
    const checks = [];
    const check = (name, expected, got) => {
      const ok = expected === null || expected === undefined ? null
        : String(expected).toLowerCase() === String(got).toLowerCase();
      checks.push({ name, ok, expected, got });
    };
    check("bets_commitment", draw.bets_commitment, commitment);
    check("pot_sats", round.pot_sats, pot.toString());
    if (draw.tip_height_at_close !== null && draw.tip_height_at_close !== undefined &&
        draw.block_height !== null && draw.block_height !== undefined) {
      check("block_height", Number(draw.tip_height_at_close) + 1, draw.block_height);
    }
    check("seed", draw.seed, seed);
    let ticket = null;
    let winner = null;
    const ranges = [];
    if (pot > 0n) {
      ticket = BigInt("0x" + seed) % pot;
      let start = 0n;
      for (const b of bets) {
        const end = start + BigInt(b.amount_sats);
        ranges.push({ bet_id: b.bet_id, username: b.username, start, end });
        if (ticket >= start && ticket < end) winner = b;
        start = end;
      }
      check("ticket", draw.ticket, ticket.toString());
      if (bets.some((b) => b.range_start !== undefined && b.range_start !== null)) {
        const fmt = (list) => list.map((r) => `${r[0]}-${r[1]}`).join(" ");
        check("ranges",
          fmt(bets.map((b) => [b.range_start, b.range_end])),
          fmt(ranges.map((r) => [r.start, r.end])));
      }
      if (draw.winner) {
        check("winner", `${draw.winner.bet_id}:${draw.winner.username}`,
          `${winner.bet_id}:${winner.username}`);
      }
    }
    return {
      ok: checks.every((c) => c.ok !== false),
      checks,
      commitment,
      seed,
      ticket,
      ranges,
      winner,
    };
  }

  window.PotluckDraw = { verify, sha256, hexToBytes, bytesToHex };
})();
