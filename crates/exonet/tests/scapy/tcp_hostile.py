"""Hostile input at a TCP echo server on the protocol library (`exonet
tcp-pingpong --listen`), around a legitimate connection from Linux's own
TCP whose 4-tuple and sequence numbers are learned by sniffing it:
out-of-window data and ACKs, blind RSTs and SYNs (RFC 5961 §3, §4), data
with an unacceptable ACK (§5), an old timestamp (PAWS), a retransmission of
delivered bytes with different data, bad checksums, bad data offsets and
malformed options. Then a connection of scapy's own, from an address of
the subnet that no host has (announced by an ARP request, so that exonet
sends to Linux's interface, where Linux drops it), with a SYN of nonsense options
(MSS 0, window scale 200, timestamps of the wrong length) and overlapping
out-of-order segments with different data: the echo must be the first
copy. Then a SYN flood from spoofed addresses of the rig's subnet; the
script prints "flooded" and waits for a line on stdin (the test looks at
the server's counters and connects from Linux meanwhile, through SYN
cookies), then resets the flood's half-open connections as their hosts
would (the RSTs for cookies' SYN-ACKs find nothing, as they should). The legitimate ping-pong must go on
correct between the steps.

usage: tcp_hostile.py IFACE DST_IP DST_MAC PORT FLOOD OWN_PORT
Prints "sent ..." counts and "result ok" (exit 0) only if all held.
"""
import random
import select
import socket
import sys
import time

from scapy.all import ARP, IP, TCP, AsyncSniffer, Ether, Raw, conf, get_if_addr, get_if_hwaddr, sendp, srp1

iface, dst_ip, dst_mac, port, flood, own_port = sys.argv[1:7]
port, flood, own_port = int(port), int(flood), int(own_port)
conf.verb = 0
src_ip, src_mac = get_if_addr(iface), get_if_hwaddr(iface)
eth = Ether(src=src_mac, dst=dst_mac)
M32 = 1 << 32
failures = []


def check(ok, what):
    if not ok:
        failures.append(what)
        print("FAILED: " + what, flush=True)


# The legitimate connection: Linux's TCP, ping-pong with checked echoes.
legit = socket.create_connection((dst_ip, port), timeout=5)
legit.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
cport = legit.getsockname()[1]
rounds = 0


def ping_pong(n):
    global rounds
    for _ in range(n):
        msg = bytes((rounds * 7 + j) % 256 for j in range(64))
        legit.sendall(msg)
        back = b""
        while len(back) < len(msg):
            chunk = legit.recv(len(msg) - len(back))
            if not chunk:
                break
            back += chunk
        if back != msg:
            return False
        rounds += 1
    return True


sniffer = AsyncSniffer(
    iface=iface,
    lfilter=lambda p: TCP in p and cport in (p[TCP].sport, p[TCP].dport),
)
sniffer.start()
time.sleep(0.5)
check(ping_pong(20), "ping-pong before the attack")
time.sleep(0.3)
seen = sniffer.stop()


def ts_of(p):
    for k, v in p[TCP].options:
        if k == "Timestamp":
            return v
    return None


mine = [p for p in seen if p[TCP].sport == cport]
theirs = [p for p in seen if p[TCP].dport == cport]
check(mine and theirs, "sniffed the legitimate connection")
# Linux's next sequence number, exonet's, and the latest timestamps.
S = (mine[-1][TCP].seq + len(mine[-1][TCP].payload)) % M32
A = (theirs[-1][TCP].seq + len(theirs[-1][TCP].payload)) % M32
ts_l, ts_e = ts_of(mine[-1])[0], ts_of(theirs[-1])[0]


def ip(src=None, **kw):
    return IP(src=src or src_ip, dst=dst_ip, **kw)


def forged(flags, seq, ack, payload=b"", tsval=None, **kw):
    opts = [("NOP", None), ("NOP", None), ("Timestamp", ((tsval or ts_l) % M32, ts_e))]
    tcp = TCP(sport=cport, dport=port, flags=flags, seq=seq % M32, ack=ack % M32, window=502, options=opts, **kw)
    return eth / ip() / tcp / Raw(payload)


def raw_options(flags, seq, ack, options, sport=None, src=None, window=502):
    """A segment whose option bytes are given as they go on the wire."""
    pad = options + b"\0" * (-len(options) % 4)
    tcp = TCP(sport=sport or cport, dport=port, flags=flags, seq=seq % M32, ack=ack % M32, window=window,
              dataofs=5 + len(pad) // 4)
    return eth / ip(src) / tcp / Raw(pad)


evil = b"INJECTED"
good = bytes(TCP(sport=cport, dport=port, flags="PA", seq=S, ack=A) / Raw(evil))
bad_sum = bytearray(good)
bad_sum[16] ^= 0x5A
challenged = [
    # RFC 5961 §3: RSTs in the window but not at RCV.NXT.
    forged("R", S + 1, 0),
    forged("R", S + 100, 0),
    forged("R", S + 1000, 0),
    # §4: SYNs on the synchronized connection, in and far out of the window.
    forged("S", S + 7, 0),
    forged("S", S - (1 << 30), 0),
    # §5: data whose ACK is older than SND.UNA - MAX.SND.WND.
    forged("PA", S, A - (1 << 30), evil),
]
quiet = [
    # A RST far out of the window: dropped without an answer.
    forged("R", S + (1 << 31), 0),
    # Out-of-window data, an ACK for data never sent.
    forged("PA", S + (1 << 30), A, evil),
    forged("A", S, A + (1 << 20)),
    # PAWS: a timestamp far older than TS.Recent.
    forged("PA", S, A, evil, tsval=ts_l - (1 << 20)),
    # A retransmission of delivered bytes with different data.
    forged("PA", S - 8, A, b"XXXXXXXX"),
    # Bad checksum; data offsets beyond the segment and below the header.
    eth / ip(proto=6) / Raw(bytes(bad_sum)),
    eth / ip() / TCP(sport=cport, dport=port, flags="PA", seq=S, ack=A, dataofs=15) / Raw(evil),
    eth / ip() / TCP(sport=cport, dport=port, flags="PA", seq=S, ack=A, dataofs=2) / Raw(evil),
    # A TCP header cut short.
    eth / ip(proto=6) / Raw(good[:12]),
    # Malformed options on pure ACKs: a length past the option space, a
    # zero length, timestamps of the wrong length, MSS 0 and window scale
    # 200 where they do not belong.
    raw_options("A", S, A, b"\x08\x28\x00\x00"),
    raw_options("A", S, A, b"\x05\x00\x01\x01"),
    raw_options("A", S, A, b"\x08\x06\x00\x00\x00\x01"),
    raw_options("A", S, A, b"\x02\x04\x00\x00\x03\x03\xc8"),
]
sendp(challenged, iface=iface)
time.sleep(0.2)
sendp(quiet, iface=iface)
time.sleep(0.2)
print("sent %d challenged %d quiet" % (len(challenged), len(quiet)), flush=True)
check(ping_pong(20), "ping-pong after the forged segments")

# A connection of our own: a SYN with nonsense options (MSS 0, window scale
# 200, SACK permitted, then timestamps of length 6, which ends the options).
prefix = dst_ip.rsplit(".", 1)[0]
own_ip = prefix + ".3"
sendp(Ether(src=src_mac, dst="ff:ff:ff:ff:ff:ff") / ARP(op=1, hwsrc=src_mac, psrc=own_ip, pdst=dst_ip), iface=iface)
echoed = []
own = AsyncSniffer(
    iface=iface,
    lfilter=lambda p: TCP in p and p[TCP].dport == own_port and len(p[TCP].payload),
    prn=echoed.append,
    store=False,
)
own.start()
time.sleep(0.5)
isn = random.randrange(M32)
syn_opts = b"\x02\x04\x00\x00" + b"\x03\x03\xc8" + b"\x01\x04\x02" + b"\x08\x06\x00\x00\x00\x01"
synack = srp1(raw_options("S", isn, 0, syn_opts, sport=own_port, src=own_ip, window=8192), iface=iface, timeout=3)
echo = b""
if synack is not None and TCP in synack and synack[TCP].flags & 0x12 == 0x12:
    y = synack[TCP].seq + 1
    base = isn + 1

    def seg(off, data):
        return eth / ip(own_ip) / TCP(sport=own_port, dport=port, flags="PA", seq=(base + off) % M32, ack=y % M32,
                                window=8192) / Raw(data)

    sendp(eth / ip(own_ip) / TCP(sport=own_port, dport=port, flags="A", seq=base % M32, ack=y % M32, window=8192),
          iface=iface)
    # Bytes 10..20 first, out of order; then 5..25 with other data for
    # 10..20; then the hole at 0..5; then 20..30 of which 20..25 differ
    # from what was delivered. The first copy of every byte counts.
    for off, data in [(10, b"ORIGINAL10"), (5, b"AAAAAXXXXXXXXXXBBBBB"), (0, b"01234"), (20, b"ZZZZZtail!")]:
        sendp(seg(off, data), iface=iface)
        time.sleep(0.05)
    want = b"01234AAAAAORIGINAL10BBBBBtail!"
    deadline = time.time() + 5
    while time.time() < deadline and len(echo) < len(want):
        time.sleep(0.1)
        # The echo by stream offset, retransmissions included.
        byte = {}
        for p in list(echoed):
            off = (p[TCP].seq - y) % M32
            for i, b in enumerate(bytes(p[TCP].payload)):
                byte.setdefault(off + i, b)
        echo = b""
        while len(echo) in byte:
            echo += bytes([byte[len(echo)]])
        if echo:
            sendp(eth / ip(own_ip) / TCP(sport=own_port, dport=port, flags="A", seq=(base + 30) % M32,
                                   ack=(y + len(echo)) % M32, window=8192), iface=iface)
    # Gone as a host that resets: RST at RCV.NXT.
    sendp(eth / ip(own_ip) / TCP(sport=own_port, dport=port, flags="R", seq=(base + 30) % M32), iface=iface)
    print("own connection echoed %r" % echo, flush=True)
    check(echo == want, "the receiver kept the first copy of every byte")
else:
    check(False, "SYN-ACK to the SYN with nonsense options")
own.stop()

# A SYN flood from spoofed addresses of the rig's subnet (never .1 to .3),
# each from a 4-tuple of its own: a repeated one would be the same half-open
# connection's SYN again, neither new nor dropped.
sources = set()
while len(sources) < flood:
    sources.add(("%s.%d" % (prefix, random.randrange(10, 250)), random.randrange(1024, 65536)))
syns = [(s, p, random.randrange(M32)) for s, p in sources]
t = time.time()
sendp([eth / IP(src=s, dst=dst_ip) / TCP(sport=p, dport=port, flags="S", seq=q, window=1024) for s, p, q in syns],
      iface=iface)
print("flooded %d SYNs in %.2f s" % (flood, time.time() - t), flush=True)
check(ping_pong(5), "ping-pong during the flood")
if not select.select([sys.stdin], [], [], 60)[0]:
    check(False, "the test's go-ahead")
sys.stdin.readline()
# Their hosts reset the SYN-ACKs: RST at RCV.NXT ends each half-open one.
sendp([eth / IP(src=s, dst=dst_ip) / TCP(sport=p, dport=port, flags="R", seq=(q + 1) % M32) for s, p, q in syns],
      iface=iface)
check(ping_pong(20), "ping-pong after the flood")
legit.shutdown(socket.SHUT_WR)
check(legit.recv(1) == b"", "the server closes after our FIN")
legit.close()
print("ping-pong rounds %d" % rounds, flush=True)
print("result " + ("ok" if not failures else "failed: " + "; ".join(failures)), flush=True)
sys.exit(0 if not failures else 1)
