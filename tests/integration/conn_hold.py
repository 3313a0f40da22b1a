"""Open 300 connections of one kind to a daemon and hold them (conn_limits.sh).

    conn_hold.py SOCKET half-open|idle-trainer HELD

half-open: connected, never a Hello; idle-trainer: a trainer's Hello and nothing more. Checks
that exactly the oldest past the kind's cap were closed, each told so naming the cap and the
uid, then creates HELD and holds the rest open until HELD is removed (at most 30 s).
"""
import os
import socket
import struct
import sys
import time

CAPS = {"half-open": (32, "connections that have not sent their Hello"),
        "idle-trainer": (256, "trainer connections")}


def hello(role):
    """Frame{seq 1, hello{protocol 1, version "t", role}} with its length prefix."""
    body = b"\x08\x01\x12\x01t\x18" + bytes([role])
    frame = b"\x08\x01\x52" + bytes([len(body)]) + body
    return struct.pack("<I", len(frame)) + frame


def main():
    path, kind, held = sys.argv[1:]
    cap, what = CAPS[kind]
    want = f"uid {os.getuid()} has more than {cap} {what}".encode()
    conns = []
    for _ in range(300):
        s = socket.socket(socket.AF_UNIX)
        s.connect(path)
        if kind == "idle-trainer":
            s.sendall(hello(1))
            s.recv(4096)  # its HelloReply: one at a time, as trainers connect
        conns.append(s)
    time.sleep(0.5)
    closed = []
    for i, s in enumerate(conns):
        s.setblocking(False)
        try:
            data = s.recv(4096)
        except BlockingIOError:
            continue
        if want in data:
            closed.append(i)
    print(f"300 {kind} connections of one uid: {len(closed)} closed (cap {cap}), "
          f"the oldest: {closed == list(range(300 - cap))}")
    open(held, "w").close()
    deadline = time.monotonic() + 30
    while os.path.exists(held) and time.monotonic() < deadline:
        time.sleep(0.05)
    return 0 if closed == list(range(300 - cap)) else 1


if __name__ == "__main__":
    sys.exit(main())
