#!/usr/bin/env python3
"""Reads `perf script -F tid,time,event,trace` of raw_syscalls:sys_enter/sys_exit on the hub
during hub_bench's sequential phase and prints where a pair's time goes (docs/benchmarks.md,
"Node under test"; scripts/trace-hub.sh runs it): the flushes, the chain question's round trip
and the hub's time from each packet received to its next hand-off. With --flushes (a trace of
the bench's own process, TRACE=peers): `fdatasync` by file.

Sockets are told apart by their traffic, not their numbers: the peer's is the one with the
most packets received; of the others, the chain client's is the one whose writes are answered
soonest (a question and its answer; on the control API's socket an answer is followed by the
client's next call, a whole pair later).
"""
import collections
import re
import statistics
import sys

WRITE, WRITEV, SENDTO, RECVFROM, FDATASYNC, FUTEX = 1, 20, 44, 45, 75, 202
LINE = re.compile(r"\s*(\d+)\s+([\d.]+):\s+raw_syscalls:sys_(enter|exit):\s+NR (\d+) (.*)")


def calls(path):
    """Completed system calls in order of their start: (start, end, tid, nr, fd, result)."""
    pending, done = {}, []
    for line in open(path):
        m = LINE.match(line)
        if not m:
            continue
        tid, t, kind, nr, rest = m.groups()
        t, nr = float(t), int(nr)
        if kind == "enter":
            fd = re.match(r"\(([0-9a-f]+)", rest)
            pending[tid] = (t, nr, int(fd.group(1), 16) if fd else -1)
        elif tid in pending:
            start, nr0, fd = pending.pop(tid)
            result = int(re.match(r"= (-?\d+)", rest).group(1))
            done.append((start, t, tid, nr0, fd, result))
    return sorted(done)


def us(values):
    if not values:
        return "none"
    q = statistics.quantiles(values, n=10) if len(values) > 1 else [values[0]] * 9
    return f"median {statistics.median(values):.0f} us (p10 {q[0]:.0f}, p90 {q[8]:.0f}, n {len(values)})"


def main(path):
    cs = calls(path)
    flushes = [(e - s) * 1e6 for s, e, _, nr, _, _ in cs if nr == FDATASYNC]
    received = collections.Counter(fd for _, _, _, nr, fd, r in cs if nr == RECVFROM and r > 0)
    peer = received.most_common(1)[0][0] if received else None
    trips = collections.defaultdict(list)
    asked = {}
    for s, e, _, nr, fd, r in cs:
        if fd == peer:
            continue
        if nr in (WRITE, WRITEV):
            asked[fd] = s
        elif nr == RECVFROM and r > 0 and fd in asked:
            trips[fd].append((e - asked.pop(fd)) * 1e6)
    print(f"fdatasync: {us(flushes)}")
    # The hub receives 4 packets a pair. Sockets answered at least every other pair (the
    # eventfd's 8-byte writes are never read back by recvfrom).
    pairs = received.get(peer, 0) / 4
    answered = [rt for rt in trips.values() if len(rt) >= pairs / 2]
    if answered:
        rt = min(answered, key=statistics.median)
        print(f"chain question, request written to answer read: {us(rt)}")
    # From a packet received to the hub's next hand-off on that thread: the wake of the
    # writer thread (futex), a packet sent or a question written.
    after = collections.defaultdict(list)
    for i, (s, e, tid, nr, fd, r) in enumerate(cs):
        if nr != RECVFROM or fd != peer or r <= 0:
            continue
        for s2, _, tid2, nr2, _, _ in cs[i + 1:]:
            if tid2 == tid and nr2 in (FUTEX, SENDTO, WRITEV):
                after[r].append((s2 - e) * 1e6)
                break
    for size in sorted(after):
        print(f"packet of {size} bytes received to the next hand-off: {us(after[size])}")


def flushes(path):
    """`fdatasync` durations by file descriptor, the files flushed 100 times or more."""
    by_fd = collections.defaultdict(list)
    for s, e, _, nr, fd, _ in calls(path):
        if nr == FDATASYNC:
            by_fd[fd].append((e - s) * 1e6)
    for fd, values in sorted(by_fd.items(), key=lambda kv: -len(kv[1])):
        if len(values) >= 100:
            print(f"fdatasync of file descriptor {fd}: {us(values)}")


if __name__ == "__main__":
    if sys.argv[1] == "--flushes":
        flushes(sys.argv[2])
    else:
        main(sys.argv[1])
