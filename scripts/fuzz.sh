#!/usr/bin/env bash
# Runs every fuzz target for a bounded time: `bash scripts/fuzz.sh [SECONDS]` (default 60 each).
# Seeds each corpus with the protocol vectors. cargo fuzz needs nightly flags; on the
# single stable toolchain RUSTC_BOOTSTRAP=1 provides them.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${1:-60}"
vectors="${POTLUCK_VECTORS_DIR:-../shared/vectors}"

if ! command -v cargo-fuzz >/dev/null 2>&1; then
  cargo install cargo-fuzz --locked
fi
export RUSTC_BOOTSTRAP=1

seed() { # seed TARGET KIND: writes one corpus file per vector
  local dir="fuzz/corpus/$1"
  mkdir -p "$dir"
  python3 - "$vectors" "$dir" "$2" <<'PY'
import json, sys, pathlib, hashlib
vectors, out, kind = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2]), sys.argv[3]
items = []
pk = json.loads((vectors / "packets_and_encodings.json").read_text())
tr = json.loads((vectors / "session_transcript.json").read_text())
fs = json.loads((vectors / "full_session_40361e3dd.json").read_text())
frames = tr["frames"] + fs["A_to_B"] + fs["B_to_A"]
if kind == "pkt":
    items = [p["protobuf_hex"] for p in pk["packets"]] + [f["plaintext_protobuf"] for f in frames]
elif kind == "payloads":
    # mode byte 1 (tamper), then the vector plaintexts separated by 0xff
    items = ["01" + "ff".join(p["protobuf_hex"] for p in pk["packets"][:6])]
    items += ["00" + "".join(f["frame"] for f in tr["frames"] if f["from"] == "B")]
elif kind == "rpc":
    # JSON-RPC bodies for the development chain's server
    reqs = [
        '{"method":"getblockchaininfo","id":1}',
        '{"jsonrpc":"2.0","id":"a","method":"getblockhash","params":{"height":0}}',
        '[{"method":"getblockcount"},{"method":"getblock","params":["0f9188f13cb7b2c71f2a335e3a4fc328bf5beb436012afca590b1a11466e2206",2]}]',
        '{"method":"sendrawtransaction","params":["0200000001aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa0000000000ffffffff0100e1f50500000000160014aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa00000000"]}',
        '{"method":"testmempoolaccept","params":[["00"],0.1]}',
        '{"method":"gettxout","params":["00000000000000000000000000000000000000000000000000000000000000aa",0,true]}',
        '{"method":"getrawmempool","params":[true]}',
        '{"method":"invalidateblock","params":["0f9188f13cb7b2c71f2a335e3a4fc328bf5beb436012afca590b1a11466e2206"]}',
    ]
    items = [r.encode().hex() for r in reqs]
elif kind == "onion":
    # mode 0 + BOLT 4's vector onion; mode 1 + plaintexts: a final hop's payload, a long length
    onion = json.loads(pathlib.Path("crates/onion/tests/vectors/bolt04-onion-test.json").read_text())
    items = ["00" + onion["onion"], "01" + "06020101040101" + "00" * 32, "01fd04f2"]
elif kind == "stream":
    # chunk size byte, then B's recorded stream: session key, authenticate, hello, ...
    stream = tr["B"]["session_pubkey_sent_first_33_bytes"] + "".join(f["frame"] for f in tr["frames"] if f["from"] == "B")
    items = ["ff" + stream, "07" + stream, "21" + stream]
for h in items:
    b = bytes.fromhex(h)
    (out / hashlib.sha256(b).hexdigest()[:16]).write_bytes(b)
PY
}

run() { # run TARGET KIND
  seed "$1" "$2"
  echo "fuzzing $1 for ${seconds}s"
  cargo fuzz run --sanitizer none "$1" -- -max_total_time="$seconds" -max_len=4096 -print_final_stats=1
}

run pkt_decode pkt
run frame_open payloads
run handshake stream
run rpc_request rpc
run chain_store none
run onion_peel onion
