// QR code encoder (ISO/IEC 18004): byte mode, error correction level M,
// versions 1-10 (up to 213 bytes, plenty for an address or a BIP21 URI).
// Output: an SVG element built through the DOM (the CSP forbids inline code).
"use strict";
(function () {
  // Level M block structure per version: [ec codewords per block,
  // [blocks, data codewords per block], optional second group].
  const BLOCKS_M = [
    null,
    [10, [1, 16]],
    [16, [1, 28]],
    [26, [1, 44]],
    [18, [2, 32]],
    [24, [2, 43]],
    [16, [4, 27]],
    [18, [4, 31]],
    [22, [2, 38], [2, 39]],
    [22, [3, 36], [2, 37]],
    [26, [4, 43], [1, 44]],
  ];
  const ALIGN = [null, [], [6, 18], [6, 22], [6, 26], [6, 30], [6, 34],
    [6, 22, 38], [6, 24, 42], [6, 26, 46], [6, 28, 50]];

  // GF(256) with the QR polynomial x^8 + x^4 + x^3 + x^2 + 1.
  const EXP = new Uint8Array(512);
  const LOG = new Uint8Array(256);
  (function () {
    let x = 1;
    for (let i = 0; i < 255; i++) {
      EXP[i] = x;
      LOG[x] = i;
      x <<= 1;
      if (x & 0x100) x ^= 0x11d;
    }
    for (let i = 255; i < 512; i++) EXP[i] = EXP[i - 255];
  })();
  function mul(a, b) {
    return a === 0 || b === 0 ? 0 : EXP[LOG[a] + LOG[b]];
  }

  // Generator polynomial prod(x - a^i), i < n, highest degree first.
  function generator(n) {
    let g = [1];
    for (let i = 0; i < n; i++) {
      const next = new Array(g.length + 1).fill(0);
      for (let k = 0; k < g.length; k++) {
        next[k] ^= g[k];
        next[k + 1] ^= mul(g[k], EXP[i]);
      }
      g = next;
    }
    return g;
  }

  function reedSolomon(data, n) {
    const g = generator(n);
    const msg = data.concat(new Array(n).fill(0));
    for (let i = 0; i < data.length; i++) {
      const c = msg[i];
      if (c === 0) continue;
      for (let j = 0; j < g.length; j++) msg[i + j] ^= mul(g[j], c);
    }
    return msg.slice(data.length);
  }

  function dataCapacity(v) {
    const b = BLOCKS_M[v];
    let n = b[1][0] * b[1][1];
    if (b[2]) n += b[2][0] * b[2][1];
    return n;
  }

  // Mode, count, bytes, terminator, padding: the data codewords.
  function dataCodewords(bytes, v) {
    const cap = dataCapacity(v);
    const bits = [];
    const put = (value, len) => {
      for (let i = len - 1; i >= 0; i--) bits.push((value >>> i) & 1);
    };
    put(0b0100, 4);
    put(bytes.length, v < 10 ? 8 : 16);
    for (const b of bytes) put(b, 8);
    put(0, Math.min(4, cap * 8 - bits.length));
    while (bits.length % 8) bits.push(0);
    const out = [];
    for (let i = 0; i < bits.length; i += 8) {
      let b = 0;
      for (let j = 0; j < 8; j++) b = (b << 1) | bits[i + j];
      out.push(b);
    }
    for (let pad = 0xec; out.length < cap; pad ^= 0xec ^ 0x11) out.push(pad);
    return out;
  }

  // Split into blocks, add error correction, interleave.
  function codewords(data, v) {
    const b = BLOCKS_M[v];
    const ecLen = b[0];
    const blocks = [];
    let pos = 0;
    for (const group of b.slice(1)) {
      for (let i = 0; i < group[0]; i++) {
        const d = data.slice(pos, pos + group[1]);
        pos += group[1];
        blocks.push({ d, e: reedSolomon(d, ecLen) });
      }
    }
    const out = [];
    const maxData = Math.max(...blocks.map((x) => x.d.length));
    for (let i = 0; i < maxData; i++) {
      for (const blk of blocks) if (i < blk.d.length) out.push(blk.d[i]);
    }
    for (let i = 0; i < ecLen; i++) for (const blk of blocks) out.push(blk.e[i]);
    return out;
  }

  function bchFormat(mask) {
    // Level M = 00, then the mask; BCH(15,5) with generator 0x537.
    const bits = (0 << 3) | mask;
    let rem = bits;
    for (let i = 0; i < 10; i++) rem = (rem << 1) ^ ((rem >>> 9) * 0x537);
    return ((bits << 10) | rem) ^ 0x5412;
  }

  function bchVersion(v) {
    let rem = v;
    for (let i = 0; i < 12; i++) rem = (rem << 1) ^ ((rem >>> 11) * 0x1f25);
    return (v << 12) | rem;
  }

  const MASKS = [
    (r, c) => (r + c) % 2 === 0,
    (r) => r % 2 === 0,
    (r, c) => c % 3 === 0,
    (r, c) => (r + c) % 3 === 0,
    (r, c) => (Math.floor(r / 2) + Math.floor(c / 3)) % 2 === 0,
    (r, c) => ((r * c) % 2) + ((r * c) % 3) === 0,
    (r, c) => (((r * c) % 2) + ((r * c) % 3)) % 2 === 0,
    (r, c) => (((r + c) % 2) + ((r * c) % 3)) % 2 === 0,
  ];

  function build(v, words, mask) {
    const size = 17 + 4 * v;
    const m = [];
    const fn = [];
    for (let i = 0; i < size; i++) {
      m.push(new Array(size).fill(false));
      fn.push(new Array(size).fill(false));
    }
    const set = (r, c, dark) => {
      m[r][c] = dark;
      fn[r][c] = true;
    };
    // Finder patterns with their light separators.
    for (const [r0, c0] of [[0, 0], [0, size - 7], [size - 7, 0]]) {
      for (let dr = -1; dr <= 7; dr++) {
        for (let dc = -1; dc <= 7; dc++) {
          const r = r0 + dr;
          const c = c0 + dc;
          if (r < 0 || c < 0 || r >= size || c >= size) continue;
          const ring = Math.max(Math.abs(dr - 3), Math.abs(dc - 3));
          set(r, c, ring !== 2 && ring !== 4);
        }
      }
    }
    // Timing patterns.
    for (let i = 8; i < size - 8; i++) {
      set(6, i, i % 2 === 0);
      set(i, 6, i % 2 === 0);
    }
    // Alignment patterns, except where they would hit a finder.
    const al = ALIGN[v];
    for (const r of al) {
      for (const c of al) {
        if ((r === 6 && c === 6) || (r === 6 && c === al[al.length - 1]) ||
            (r === al[al.length - 1] && c === 6)) continue;
        for (let dr = -2; dr <= 2; dr++) {
          for (let dc = -2; dc <= 2; dc++) {
            set(r + dr, c + dc, Math.max(Math.abs(dr), Math.abs(dc)) !== 1);
          }
        }
      }
    }
    // Format information (both copies) and the dark module.
    const f = bchFormat(mask);
    const bit = (x, i) => ((x >>> i) & 1) === 1;
    for (let i = 0; i <= 5; i++) set(i, 8, bit(f, i));
    set(7, 8, bit(f, 6));
    set(8, 8, bit(f, 7));
    set(8, 7, bit(f, 8));
    for (let i = 9; i < 15; i++) set(8, 14 - i, bit(f, i));
    for (let i = 0; i < 8; i++) set(8, size - 1 - i, bit(f, i));
    for (let i = 8; i < 15; i++) set(size - 15 + i, 8, bit(f, i));
    set(size - 8, 8, true);
    // Version information from version 7 on.
    if (v >= 7) {
      const vb = bchVersion(v);
      for (let i = 0; i < 18; i++) {
        const a = size - 11 + (i % 3);
        const b = Math.floor(i / 3);
        set(b, a, bit(vb, i));
        set(a, b, bit(vb, i));
      }
    }
    // Data in the zigzag, two columns at a time from the bottom right,
    // skipping the vertical timing column.
    let i = 0;
    const total = words.length * 8;
    for (let right = size - 1; right >= 1; right -= 2) {
      if (right === 6) right = 5;
      const upward = ((right + 1) & 2) === 0;
      for (let vert = 0; vert < size; vert++) {
        const r = upward ? size - 1 - vert : vert;
        for (let j = 0; j < 2; j++) {
          const c = right - j;
          if (fn[r][c]) continue;
          let dark = false;
          if (i < total) {
            dark = ((words[i >>> 3] >>> (7 - (i & 7))) & 1) === 1;
            i++;
          }
          m[r][c] = dark !== MASKS[mask](r, c);
        }
      }
    }
    return m;
  }

  // The four penalty rules of the standard's mask evaluation.
  function penalty(m) {
    const size = m.length;
    let p = 0;
    const line = (get) => {
      let run = 1;
      for (let i = 1; i <= size; i++) {
        if (i < size && get(i) === get(i - 1)) {
          run++;
        } else {
          if (run >= 5) p += 3 + (run - 5);
          run = 1;
        }
      }
      const pat = [true, false, true, true, true, false, true];
      for (let i = 0; i + 7 <= size; i++) {
        if (!pat.every((x, k) => get(i + k) === x)) continue;
        const lightBefore = [1, 2, 3, 4].every((k) => i - k < 0 || !get(i - k));
        const lightAfter = [0, 1, 2, 3].every((k) => i + 7 + k >= size || !get(i + 7 + k));
        if (lightBefore || lightAfter) p += 40;
      }
    };
    for (let r = 0; r < size; r++) line((c) => m[r][c]);
    for (let c = 0; c < size; c++) line((r) => m[r][c]);
    for (let r = 0; r + 1 < size; r++) {
      for (let c = 0; c + 1 < size; c++) {
        const x = m[r][c];
        if (m[r][c + 1] === x && m[r + 1][c] === x && m[r + 1][c + 1] === x) p += 3;
      }
    }
    let dark = 0;
    for (const row of m) for (const x of row) if (x) dark++;
    p += Math.floor(Math.abs((dark * 100) / (size * size) - 50) / 5) * 10;
    return p;
  }

  /** The module matrix (true = dark) of `text` as UTF-8 bytes. */
  function matrix(text) {
    const bytes = Array.from(new TextEncoder().encode(text));
    let v = 1;
    // 4 mode bits + the count field must fit along with the bytes.
    while (v <= 10 && 4 + (v < 10 ? 8 : 16) + bytes.length * 8 > dataCapacity(v) * 8) v++;
    if (v > 10) throw new Error("too long for a QR code of version 10");
    const words = codewords(dataCodewords(bytes, v), v);
    let best = null;
    let bestScore = Infinity;
    for (let mask = 0; mask < 8; mask++) {
      const m = build(v, words, mask);
      const score = penalty(m);
      if (score < bestScore) {
        best = m;
        bestScore = score;
      }
    }
    return best;
  }

  /** An SVG element showing the QR code of `text`, with a 4-module quiet zone. */
  function svg(text) {
    const m = matrix(text);
    const size = m.length + 8;
    const NS = "http://www.w3.org/2000/svg";
    const el = document.createElementNS(NS, "svg");
    el.setAttribute("viewBox", `0 0 ${size} ${size}`);
    el.setAttribute("shape-rendering", "crispEdges");
    el.setAttribute("role", "img");
    const bg = document.createElementNS(NS, "rect");
    bg.setAttribute("width", String(size));
    bg.setAttribute("height", String(size));
    bg.setAttribute("fill", "#fff");
    el.appendChild(bg);
    let d = "";
    m.forEach((row, r) => row.forEach((dark, c) => {
      if (dark) d += `M${c + 4} ${r + 4}h1v1h-1z`;
    }));
    const path = document.createElementNS(NS, "path");
    path.setAttribute("d", d);
    path.setAttribute("fill", "#000");
    el.appendChild(path);
    return el;
  }

  window.PotluckQr = { matrix, svg };
})();
