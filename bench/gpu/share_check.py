"""The torch side of bench/gpu/share_check.c: a trainer process that receives the daemon's
device region and event over a Unix socket, maps the region through libzc (zerod._cuda), sees it
as a tensor on cuda:0, waits on the daemon's event on its stream, checks the daemon's pattern,
adds 2, records its own interprocess event and sends the handle back. The check's .item() is
the only CPU wait.

    python3 share_check.py FD      (FD: its end of a SOCK_SEQPACKET socketpair)
Needs PYTHONPATH to reach client/python and ZEROD_LIBZC (or a build) for libzc.
"""
import os
import socket
import struct
import sys

import torch

from zerod._codes import DTYPE_F32
from zerod._cuda import DeviceRegion

MSG = struct.Struct("<IIQQ64s")  # bench/gpu/share_check.c, msg_t
MSG_REGION, MSG_DONE = 1, 2


def main():
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET, fileno=int(sys.argv[1]))
    sock.settimeout(60)
    data, fds, _, _ = socket.recv_fds(sock, MSG.size, 1)
    kind, _, size, numel, ev = MSG.unpack(data)
    if kind != MSG_REGION or len(fds) != 1:
        print("share_check.py: expected the region and its fd, got type %d with %d fds"
              % (kind, len(fds)))
        return 1
    torch.cuda.set_device(0)
    region = DeviceRegion(fds[0], size, 0)
    x = region.tensor(DTYPE_F32, numel)
    stream = torch.cuda.Stream()
    daemon_ev = torch.cuda.Event.from_ipc_handle(0, ev)
    mine = torch.cuda.Event(interprocess=True)
    with torch.cuda.stream(stream):
        stream.wait_event(daemon_ev)
        want = (torch.arange(numel, device="cuda:0", dtype=torch.int64) % 1021).float()
        bad = int((x != want).sum().item())  # .item() waits for this stream only
        x.add_(2.0)
        mine.record(stream)
    print("share_check.py: torch view %s at 0x%x: %d of %d elements differ from the daemon's"
          % (tuple(x.shape), region.ptr, bad, numel))
    sock.send(MSG.pack(MSG_DONE, 0, 0, 0, mine.ipc_handle()))
    stream.synchronize()
    del x
    region.close()
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
