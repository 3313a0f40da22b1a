#!/usr/bin/env python3
"""A strict reader of the Prometheus text exposition format (version 0.0.4), for
tests/integration/metrics.sh: it validates a scrape whether or not promtool is installed, and
gives the samples to the test's value checks.

    metrics_check.py FILE...     validate each file; "FILE: text format ok, ..." or an error
    metrics_check.py --garbage PORT   send two malformed requests; prints what came back
    metrics_check.py --stall PORT N HOLD
                                 open N connections that send half a request line, print
                                 "open K of N", hold them while the file HOLD exists (60 s at most)
    metrics_check.py --get WHERE PATH OUT
                                 GET PATH from 127.0.0.1:WHERE (a port) or the unix socket WHERE
                                 (a path) into OUT; prints the HTTP status (000: no answer in 5 s)
    import metrics_check; metrics_check.parse(text) -> {(name, frozenset(labels)): value}
"""
import math
import re
import sys

NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
LABEL = r"[a-zA-Z_][a-zA-Z0-9_]*"
SAMPLE = re.compile(r"^(" + NAME + r")(?:\{(.*)\})? (\S+)(?: (-?\d+))?$")
PAIR = re.compile(r"(" + LABEL + r')="((?:[^"\\\n]|\\[\\"n])*)"(,|$)')
TYPES = ("counter", "gauge", "histogram", "summary", "untyped")


class FormatError(Exception):
    pass


def _labels(text, where):
    labels, pos = {}, 0
    while pos < len(text):
        m = PAIR.match(text, pos)
        if m is None:
            raise FormatError("%s: bad label pairs {%s}" % (where, text))
        name = m.group(1)
        if name in labels:
            raise FormatError("%s: label %s twice" % (where, name))
        labels[name] = re.sub(r"\\(.)", lambda e: "\n" if e.group(1) == "n" else e.group(1),
                              m.group(2))
        pos = m.end()
    return labels


def _value(text, where):
    if text in ("NaN", "+Inf", "-Inf"):
        return float(text.replace("Inf", "inf").replace("NaN", "nan"))
    if not re.fullmatch(r"[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?", text):
        raise FormatError("%s: bad value %r" % (where, text))
    return float(text)


def _family(name, types):
    for suffix in ("_bucket", "_sum", "_count"):
        base = name[: -len(suffix)]
        if name.endswith(suffix) and types.get(base) == "histogram":
            return base
    return name


def _check_histograms(samples, types):
    series = {}
    for (name, labels), v in samples.items():
        fam = _family(name, types)
        if types.get(fam) != "histogram":
            continue
        rest = frozenset((k, x) for k, x in labels if k != "le")
        s = series.setdefault((fam, rest), {"buckets": []})
        if name.endswith("_bucket"):
            le = dict(labels).get("le")
            if le is None:
                raise FormatError("%s: a bucket without le" % name)
            s["buckets"].append((_value(le, name), v))
        else:
            s[name[len(fam) + 1:]] = v
    for (fam, rest), s in series.items():
        b = sorted(s["buckets"])
        if not b or b[-1][0] != math.inf:
            raise FormatError("%s%s: no +Inf bucket" % (fam, sorted(rest)))
        if any(b[i][1] > b[i + 1][1] for i in range(len(b) - 1)):
            raise FormatError("%s%s: buckets not cumulative" % (fam, sorted(rest)))
        if "count" not in s or "sum" not in s or s["count"] != b[-1][1]:
            raise FormatError("%s%s: _count/_sum missing or _count != +Inf bucket" %
                              (fam, sorted(rest)))


def parse(text):
    """The samples of a scrape; FormatError names the first line that breaks the format."""
    if text and not text.endswith("\n"):
        raise FormatError("the last line has no newline")
    types, helps, samples, closed, current = {}, {}, {}, set(), None
    for n, line in enumerate(text.split("\n")[:-1], 1):
        where = "line %d" % n
        if line.startswith("#"):
            parts = line.split(" ", 3)
            if len(parts) >= 3 and parts[1] in ("HELP", "TYPE"):
                if not re.fullmatch(NAME, parts[2]):
                    raise FormatError("%s: bad metric name %r" % (where, parts[2]))
                seen = types if parts[1] == "TYPE" else helps
                if parts[2] in seen:
                    raise FormatError("%s: second %s for %s" % (where, parts[1], parts[2]))
                if parts[1] == "TYPE":
                    if len(parts) != 4 or parts[3] not in TYPES:
                        raise FormatError("%s: bad TYPE line" % where)
                    if any(_family(k[0], {parts[2]: parts[3]}) == parts[2] for k in samples):
                        raise FormatError("%s: TYPE of %s after its samples" % (where, parts[2]))
                seen[parts[2]] = parts[3] if len(parts) == 4 else ""
            continue
        if line.strip() == "":
            continue
        m = SAMPLE.match(line)
        if m is None:
            raise FormatError("%s: not a sample: %r" % (where, line))
        name = m.group(1)
        labels = frozenset(_labels(m.group(2) or "", where).items())
        fam = _family(name, types)
        if fam != current:
            if fam in closed:
                raise FormatError("%s: samples of %s are not together" % (where, fam))
            if current is not None:
                closed.add(current)
            current = fam
        if fam not in types:
            raise FormatError("%s: %s has no TYPE" % (where, fam))
        if types[fam] == "counter" and not fam.endswith("_total"):
            raise FormatError("%s: counter %s does not end in _total" % (where, fam))
        if (name, labels) in samples:
            raise FormatError("%s: %s%s twice" % (where, name, sorted(labels)))
        samples[(name, labels)] = _value(m.group(3), where)
    _check_histograms(samples, types)
    return samples


def get(where, path, out):
    """What curl does in metrics.sh, for machines without it (http.client, also over AF_UNIX)."""
    import http.client
    import socket

    class UnixConnection(http.client.HTTPConnection):
        def connect(self):
            self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self.sock.settimeout(self.timeout)
            self.sock.connect(where)

    try:
        if where.startswith("/"):
            conn = UnixConnection("localhost", timeout=5)
        else:
            conn = http.client.HTTPConnection("127.0.0.1", int(where), timeout=5)
        conn.request("GET", path)
        resp = conn.getresponse()
        body = resp.read()
        status = resp.status
        conn.close()
    except (OSError, http.client.HTTPException):
        print("000")
        return 0
    with open(out, "wb") as f:
        f.write(body)
    print(status)
    return 0


def garbage(port):
    """Binary junk, then a header line larger than the daemon's per-connection memory."""
    import os
    import socket

    for junk in (b"\x16\x03\x01\x02\x00GET /\x00\xff HTTP/9.9\r\n" + os.urandom(40000) + b"\r\n\r\n",
                 b"GET /metrics HTTP/1.1\r\nX-Big: " + b"a" * 100000 + b"\r\n\r\n"):
        with socket.create_connection(("127.0.0.1", int(port)), timeout=5) as s:
            try:
                s.sendall(junk)
                reply = s.recv(200)
            except OSError as e:  # reset mid-send: the daemon closed on us
                reply = ("(%s)" % e.strerror).encode()
        print("garbage answered: %r" % (reply.split(b"\r\n")[0] or b"(closed)"))
    return 0


def stall(port, n, hold):
    import os
    import selectors
    import socket
    import time

    socks, sel = [], selectors.DefaultSelector()
    for _ in range(int(n)):
        s = socket.socket()
        s.setblocking(False)
        s.connect_ex(("127.0.0.1", int(port)))
        socks.append(s)
        sel.register(s, selectors.EVENT_WRITE)
    opened, deadline = 0, time.monotonic() + 5
    while opened < len(socks) and time.monotonic() < deadline:
        for key, _ in sel.select(timeout=0.2):
            sel.unregister(key.fileobj)
            if key.fileobj.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == 0:
                opened += 1
                try:
                    key.fileobj.send(b"GET /metr")
                except OSError:
                    pass
    print("open %d of %d" % (opened, len(socks)), flush=True)
    deadline = time.monotonic() + 60
    while os.path.exists(hold) and time.monotonic() < deadline:
        time.sleep(0.1)
    for s in socks:
        s.close()
    return 0


def main(paths):
    if paths[:1] == ["--get"] and len(paths) == 4:
        return get(*paths[1:])
    if paths[:1] == ["--garbage"] and len(paths) == 2:
        return garbage(paths[1])
    if paths[:1] == ["--stall"] and len(paths) == 4:
        return stall(*paths[1:])
    for p in paths:
        with open(p, encoding="utf-8") as f:
            text = f.read()
        try:
            samples = parse(text)
        except FormatError as e:
            print("%s: %s" % (p, e), file=sys.stderr)
            return 1
        fams = {_family(k[0], {}) for k in samples}
        print("%s: text format ok, %d samples of %d metrics" % (p, len(samples), len(fams)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
