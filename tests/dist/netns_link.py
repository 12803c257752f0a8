#!/usr/bin/python3
"""Emulated hosts on one machine: a network between network namespaces with a one-way delay and a
loss rate, for running mpirun across "hosts" (tests/dist/hosts.sh).

Usage: netns_link.py READY_FILE DELAY_MS LOSS SEED NS ADDR [NS ADDR ...]
Makes a TUN device `qtlink` in each namespace NS with address ADDR/24 (MTU 65000), then forwards
every IPv4 packet read from one namespace's device to the device of the namespace that holds its
destination address, DELAY_MS milliseconds after it was read (packets keep their order), dropping
each with probability LOSS (a generator seeded with SEED). READY_FILE is written once the devices
are up. Runs until killed (SIGTERM or SIGINT: exit 0). The process itself stays in the namespace it
was started in, so killing a namespace's processes does not kill the link.

Why not veth and `tc netem`: the kernels here have no netem qdisc (`tc qdisc add ... netem` says
"Specified qdisc kind is unknown"), so the delay and the loss are added here, in user space.
"""
import ctypes
import fcntl
import heapq
import os
import random
import select
import signal
import struct
import subprocess
import sys
import time

CLONE_NEWNET = 0x40000000
TUNSETIFF = 0x400454CA
IFF_TUN, IFF_NO_PI = 0x0001, 0x1000
DEVICE = "qtlink"
MTU = 65000
libc = ctypes.CDLL(None, use_errno=True)


def fail(msg):
    sys.exit("netns_link: " + msg)


def enter(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        if libc.setns(fd, CLONE_NEWNET) != 0:
            e = ctypes.get_errno()
            fail("cannot enter the network namespace %s: %s" % (path, os.strerror(e)))
    finally:
        os.close(fd)


def tun_in(ns, addr):
    """A TUN device in namespace ns (created while this process is in it), configured."""
    enter("/run/netns/" + ns)
    fd = os.open("/dev/net/tun", os.O_RDWR | os.O_NONBLOCK)
    fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH", DEVICE.encode(), IFF_TUN | IFF_NO_PI))
    for cmd in (["addr", "add", addr + "/24", "dev", DEVICE], ["link", "set", DEVICE, "mtu", str(MTU), "up"],
                ["link", "set", "lo", "up"]):
        r = subprocess.run(["ip", "-n", ns] + cmd, capture_output=True, text=True)
        if r.returncode != 0:
            fail("ip -n %s %s: %s" % (ns, " ".join(cmd), r.stderr.strip()))
    return fd


def main():
    if len(sys.argv) < 7 or len(sys.argv) % 2 == 0:
        fail("usage: netns_link.py READY_FILE DELAY_MS LOSS SEED NS ADDR [NS ADDR ...]")
    ready, delay, loss, seed = sys.argv[1], float(sys.argv[2]) / 1000.0, float(sys.argv[3]), int(sys.argv[4])
    pairs = list(zip(sys.argv[5::2], sys.argv[6::2]))
    home = os.open("/proc/self/ns/net", os.O_RDONLY)
    by_addr, fds = {}, []
    for ns, addr in pairs:
        fd = tun_in(ns, addr)
        by_addr[bytes(int(x) for x in addr.split("."))] = fd
        fds.append(fd)
    if libc.setns(home, CLONE_NEWNET) != 0:
        fail("cannot return to the starting network namespace")
    os.close(home)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    signal.signal(signal.SIGINT, lambda *_: sys.exit(0))
    rng = random.Random(seed)
    with open(ready, "w") as f:
        f.write("%d\n" % os.getpid())
    pending, seq = [], 0  # (due, seq, device, packet): the delay is constant, so order is kept
    while True:
        timeout = max(0.0, pending[0][0] - time.monotonic()) if pending else None
        readable, _, _ = select.select(fds, [], [], timeout)
        now = time.monotonic()
        for fd in readable:
            while True:
                try:
                    pkt = os.read(fd, MTU + 64)
                except BlockingIOError:
                    break
                if len(pkt) < 20 or pkt[0] >> 4 != 4:
                    continue  # IPv4 only (the devices carry no other traffic that matters)
                out = by_addr.get(pkt[16:20])
                if out is None or (loss > 0 and rng.random() < loss):
                    continue
                if delay <= 0:
                    write(out, pkt)
                else:
                    heapq.heappush(pending, (now + delay, seq, out, pkt))
                    seq += 1
        while pending and pending[0][0] <= time.monotonic():
            _, _, out, pkt = heapq.heappop(pending)
            write(out, pkt)


def write(fd, pkt):
    try:
        os.write(fd, pkt)
    except (BlockingIOError, OSError):
        pass  # a full device queue drops the packet, as a congested link would; TCP resends it


if __name__ == "__main__":
    main()
