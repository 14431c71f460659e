#!/usr/bin/env python3
"""Groups `perf script -F comm,tid,ip,sym` samples of one process by what they were doing.

Each sample goes to the first group whose pattern matches any frame of its stack, in the
order below, per thread name; the shares are of all samples. Then, apart, the shares that
overlap those groups: the state machine's own calls, the kernel and each system call, and
malloc and free. Used by scripts/profile-hub.sh (docs/benchmarks.md, "Node under test").
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

# Shares of all samples, each counted apart (a sample may be in several): a sample is in
# one when any frame of its stack matches, or, for a leaf pattern, its innermost frame.
ACROSS = [
    ("the state machine's own calls (secp256k1 within them)",
     r"channel::channel::Channel::(on_packet|handle_packet)|channel::channel::update::<impl channel::channel::Channel>::fulfill_htlc",
     False),
    ("the kernel", r"^(entry_SYSCALL_64|do_syscall_64|asm_)", False),
    # glibc's (SQLite's own allocations, and Rust's before the binary took mimalloc) and
    # mimalloc's (`mi_*`, `_mi_*`).
    ("malloc and free (innermost frame)",
     r"^(malloc|_int_malloc|__GI___libc_malloc|_int_free|__GI___libc_free|cfree|malloc_consolidate|tcache_get|tcache_put|unlink_chunk|_int_realloc|__GI___libc_realloc|_?mi_\w+)\b",
     True),
    ("the control API's parameters (`Method::parse`)", r"node::rpc::method::Method::parse", False),
]
SYSCALL = re.compile(r"^__x64_sys_(\w+)")
INTERRUPT = re.compile(r"^asm_(sysvec_\w+|common_interrupt)")


def main(path):
    compiled = [(name, re.compile(rx)) for name, rx in GROUPS]
    across = [(name, re.compile(rx, re.M), leaf) for name, rx, leaf in ACROSS]
    counts = collections.Counter()
    apart = collections.Counter()
    syscalls = collections.Counter()
    total = 0
    comm, stack = None, []

    def done():
        nonlocal total
        if comm is None:
            return
        total += 1
        joined = "\n".join(stack)
        for name, rx, leaf in across:
            if rx.search(stack[0] if leaf and stack else joined):
                apart[name] += 1
        # The outermost system call entry of the stack (the frames run innermost first).
        for frame in reversed(stack):
            m = SYSCALL.match(frame)
            if m:
                syscalls["system call " + m.group(1)] += 1
                break
        else:
            for frame in reversed(stack):
                m = INTERRUPT.match(frame)
                if m:
                    syscalls["interrupt " + m.group(1)] += 1
                    break
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
    print("across the groups:")
    for name, _, _ in across:
        print(f"{100 * apart[name] / total:6.2f}%  {name}")
    for entry, n in syscalls.most_common(10):
        print(f"{100 * n / total:6.2f}%  {entry}")


if __name__ == "__main__":
    main(sys.argv[1])
