"""Linux sends UDP super-datagrams (UDP_SEGMENT: the kernel cuts them, or
leaves them whole across a veth) to an echo server; every datagram must come
back as it was sent.

usage: udp_gso_echo.py LOCAL_IP SERVER_IP PORT
Prints "echoed N of N datagrams" and exits 0 when all came back intact."""

import socket
import sys
import time

UDP_SEGMENT = 103  # linux/udp.h

local, server, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind((local, 0))
s.settimeout(0.2)

# (segment size, super-datagram length): the last datagram of each is shorter.
sends = [(1000, 5120), (1400, 1400 * 8), (512, 512 * 3 + 1)]
want = []
for n, (size, length) in enumerate(sends):
    payload = bytes((n * 31 + i * 7 + i // 253) % 256 for i in range(length))
    s.setsockopt(socket.SOL_UDP, UDP_SEGMENT, size)
    s.sendto(payload, (server, port))
    want += [payload[i:i + size] for i in range(0, length, size)]

got = []
deadline = time.monotonic() + 5
while len(got) < len(want) and time.monotonic() < deadline:
    try:
        got.append(s.recvfrom(65536)[0])
    except socket.timeout:
        pass

# An echo server answers in arrival order; one socket, one path: no reordering.
intact = sum(1 for g, w in zip(got, want) if g == w)
print(f"echoed {intact} of {len(want)} datagrams; got {len(got)}: {[len(g) for g in got]}")
sys.exit(0 if intact == len(want) and len(got) == len(want) else 1)
