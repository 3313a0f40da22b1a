#!/usr/bin/env python3
"""Check a `zeroctl trace` file against the Trace Event format (docs/trace.md) and against what
the job did: every event has ph, ts, pid, tid and name; complete events ("X") a dur >= 0;
events in time order; on each track spans that never overlap (the norm track: the all-reduce
inside the norm, nested); one process per rank, named "rank R", with the tracks named; the same
steps on every rank, as many as asked; a reduce-scatter for every bucket's arrival and an
all-gather for every reduce-scatter (accum 1).

    trace_check.py FILE --ranks N --steps S [--tracks step,buckets,...] [--stage 2]

Exit 0 when it holds, 1 naming the first thing that does not.
"""
import argparse
import collections
import json
import sys

EPS_US = 0.0015  # ts and dur are printed to the nanosecond: 1 ns of rounding each
NESTED_TRACKS = {"norm"}  # the all-reduce lies inside the norm


def fail(msg):
    print(f"trace_check: {msg}", file=sys.stderr)
    sys.exit(1)


def check_events(events):
    """Every event's fields and types; the non-metadata ones sorted by ts."""
    last_ts = None
    for i, e in enumerate(events):
        for key in ("ph", "ts", "pid", "tid", "name"):
            if key not in e:
                fail(f"event {i} has no '{key}': {e}")
        if not isinstance(e["ts"], (int, float)) or e["ts"] < 0:
            fail(f"event {i}: ts {e['ts']!r} is not a number >= 0")
        if not isinstance(e["pid"], int) or not isinstance(e["tid"], int):
            fail(f"event {i}: pid and tid must be integers: {e}")
        if e["ph"] not in ("X", "i", "M"):
            fail(f"event {i}: ph {e['ph']!r} is none of X, i, M")
        if e["ph"] == "X" and (not isinstance(e.get("dur"), (int, float)) or e["dur"] < 0):
            fail(f"event {i}: a complete event needs a dur >= 0: {e}")
        if e["ph"] == "i" and e.get("s") not in ("t", "p", "g"):
            fail(f"event {i}: an instant event's scope s must be t, p or g: {e}")
        if e["ph"] != "M":
            if last_ts is not None and e["ts"] < last_ts:
                fail(f"event {i}: ts {e['ts']} before the previous event's {last_ts}: not sorted")
            last_ts = e["ts"]


def metadata(events):
    """{pid: process name}, {(pid, tid): thread name}."""
    procs, threads = {}, {}
    for e in events:
        if e["ph"] != "M":
            continue
        if e["name"] == "process_name":
            procs[e["pid"]] = e["args"]["name"]
        elif e["name"] == "thread_name":
            threads[(e["pid"], e["tid"])] = e["args"]["name"]
    return procs, threads


def check_tracks(events, threads):
    """On each track, spans one after another (nested only on NESTED_TRACKS)."""
    spans = collections.defaultdict(list)
    for e in events:
        if e["ph"] == "X":
            spans[(e["pid"], e["tid"])].append(e)
    for key, evs in spans.items():
        if key not in threads:
            fail(f"pid {key[0]} tid {key[1]} has events and no thread_name")
        track = threads[key]
        stack = []  # ends of the enclosing spans
        for e in sorted(evs, key=lambda e: (e["ts"], -e["dur"])):
            end = e["ts"] + e["dur"]
            while stack and stack[-1] <= e["ts"] + EPS_US:
                stack.pop()
            if stack:
                if track not in NESTED_TRACKS:
                    fail(f"rank {key[0]} track {track}: '{e['name']}' at {e['ts']} overlaps the "
                         f"span before it (ends {stack[-1]})")
                if end > stack[-1] + EPS_US:
                    fail(f"rank {key[0]} track {track}: '{e['name']}' at {e['ts']} is not "
                         f"inside the span it starts in")
            stack.append(end)


def check_ranks(events, procs, threads, args):
    """Every rank a process named for it, with the tracks asked, the same `steps` steps."""
    want = set(range(args.ranks))
    pids = {e["pid"] for e in events if e["ph"] != "M"}
    if pids != want or set(procs) != want:
        fail(f"ranks with events {sorted(pids)}, named {sorted(procs)}; expected {sorted(want)}")
    for pid, name in procs.items():
        if name != f"rank {pid}":
            fail(f"process {pid} is named {name!r}, not 'rank {pid}'")
    tracks = [t for t in args.tracks.split(",") if t]
    steps_of = {}
    for pid in sorted(want):
        names = {n for (p, _), n in threads.items() if p == pid}
        missing = [t for t in tracks if t not in names]
        if missing:
            fail(f"rank {pid} has no track {', '.join(missing)} (it has {sorted(names)})")
        steps_of[pid] = sorted({e["args"]["step"] for e in events if e["pid"] == pid
                                and e["ph"] == "X" and threads[(pid, e["tid"])] == "step"})
        if len(steps_of[pid]) != args.steps:
            fail(f"rank {pid} covers steps {steps_of[pid]}: {len(steps_of[pid])}, expected "
                 f"{args.steps}")
    if len({tuple(s) for s in steps_of.values()}) != 1:
        fail(f"the ranks cover different steps: {steps_of}")
    return steps_of[min(want)]


def check_counts(events, steps, args):
    """Per rank: every span of the steps shown; a reduce-scatter per bucket arrival (stage 2)
    and an all-gather per reduce-scatter (accum 1, world > 1)."""
    lo, hi = min(steps), max(steps)
    for pid in range(args.ranks):
        count = collections.Counter()
        for e in events:
            if e["pid"] != pid or e["ph"] == "M":
                continue
            if not lo - 1 <= e["args"]["step"] <= hi:
                fail(f"rank {pid}: '{e['name']}' of step {e['args']['step']} outside {lo}..{hi}")
            refresh = e["args"].get("outside_a_step", False)  # parameters loaded, not a step
            count[e["name"] + (" (outside a step)" if refresh else "")] += 1
        rs, ag, bk = count["reduce-scatter"], count["all-gather"], count["bucket ready"]
        if rs == 0 or rs % len(steps) != 0:
            fail(f"rank {pid}: {rs} reduce-scatters over {len(steps)} steps")
        if args.stage == 2 and bk != rs:
            fail(f"rank {pid}: {bk} bucket arrivals, {rs} reduce-scatters")
        if args.ranks > 1 and ag != rs:
            fail(f"rank {pid}: {ag} all-gathers, {rs} reduce-scatters")
        if count["norm"] != len(steps) or count["adam"] != len(steps):
            fail(f"rank {pid}: {count['norm']} norms, {count['adam']} adams, {len(steps)} steps")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("file")
    p.add_argument("--ranks", type=int, required=True)
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--tracks", default="step,reduce-scatter,norm,adam")
    p.add_argument("--stage", type=int, default=2)
    args = p.parse_args()
    with open(args.file, encoding="utf-8") as f:
        doc = json.load(f)
    events = doc.get("traceEvents")
    if not isinstance(events, list) or not events:
        fail("traceEvents is missing or empty")
    if doc.get("displayTimeUnit") not in ("ms", "ns"):
        fail(f"displayTimeUnit {doc.get('displayTimeUnit')!r} is neither ms nor ns")
    check_events(events)
    procs, threads = metadata(events)
    check_tracks(events, threads)
    steps = check_ranks(events, procs, threads, args)
    check_counts(events, steps, args)
    print(f"{args.file}: {len(events)} events, ranks 0..{args.ranks - 1}, steps "
          f"{steps[0]}..{steps[-1]}, tracks {sorted(set(threads.values()))}: ok")


if __name__ == "__main__":
    main()
