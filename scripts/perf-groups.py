#!/usr/bin/env python3
"""Groups `perf script -F comm,tid,ip,sym` samples of one process by what they were doing.

Each sample goes to the first group whose pattern matches any frame of its stack, in the
order below, per thread name; the shares are of all samples. Used by scripts/profile-hub.sh
(docs/benchmarks.md, "Node under test").
"""
import collections
import re
import sys

GROUPS = [
    ("secp256k1 (signatures, keys)", r"rustsecp256k1"),
    ("chain RPC client", r"hyper::proto::h1::role::Client|hyper_util::client|chain::rpc"),
    ("control API (HTTP, JSON, views)", r"node::rpc::|axum::|hyper::proto::h1::role::Server|hyper::server"),
    ("snapshot encoding and JSON", r"encode_snapshot|stored_hex|serde_json"),
    ("SQLite and sqlx", r"sqlite3|sqlx"),
    ("session (frames, socket)", r"session::|aes::|hmac::|sha2::"),
    ("channel state machine (besides secp)", r"channel::"),
    ("node (manager, peers, store)", r"node::manager|node::peers|node::store"),
    ("tokio (scheduler, IO driver)", r"tokio::"),
]


def main(path):
    compiled = [(name, re.compile(rx)) for name, rx in GROUPS]
    counts = collections.Counter()
    total = 0
    comm, stack = None, []

    def done():
        nonlocal total
        if comm is None:
            return
        total += 1
        joined = "\n".join(stack)
        for name, rx in compiled:
            if rx.search(joined):
                counts[(comm, name)] += 1
                return
        counts[(comm, "other")] += 1

    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            if not line.strip():
                continue
            if not line.startswith("\t"):
                done()
                comm, stack = line.split()[0], []
            else:
                parts = line.strip().split(None, 1)
                stack.append(parts[1] if len(parts) > 1 else "")
    done()
    if total == 0:
        sys.exit("no samples")
    print(f"{total} samples")
    for (thread, name), n in counts.most_common():
        print(f"{100 * n / total:6.2f}%  {thread:<16} {name}")


if __name__ == "__main__":
    main(sys.argv[1])
