"""Hostile input at a UDP echo server on the protocol library (`exonet
udp-echo`): bad UDP and IP checksums, truncated headers, bad lengths,
overlapping fragments, tiny fragments, a flood of unfinished datagrams, and
ICMP errors quoting garbage. A good datagram must be echoed before and
after.

usage: udp_hostile.py IFACE DST_IP DST_MAC PORT FLOOD
Prints "echoed N/2" and exits 0 only if both came back.
"""
import sys

from scapy.all import ICMP, IP, UDP, Ether, Raw, conf, get_if_addr, get_if_hwaddr, sendp, srp1

iface, dst_ip, dst_mac, port, flood = sys.argv[1:6]
port, flood = int(port), int(flood)
conf.verb = 0
src_ip, src_mac = get_if_addr(iface), get_if_hwaddr(iface)
eth = Ether(src=src_mac, dst=dst_mac)


def ip(**kw):
    return IP(src=src_ip, dst=dst_ip, **kw)


def echo(tag):
    payload = b"exonet-good-" + tag
    q = eth / ip() / UDP(sport=41000, dport=port) / Raw(payload)
    r = srp1(q, iface=iface, timeout=3)
    return r is not None and UDP in r and bytes(r[UDP].payload) == payload


def udp_header(length, chksum=0):
    return (41001).to_bytes(2, "big") + port.to_bytes(2, "big") + length.to_bytes(2, "big") + chksum.to_bytes(2, "big")


ok = echo(b"before")
hostile = [
    # Checksums.
    eth / ip() / UDP(sport=41001, dport=port, chksum=0x1234) / Raw(b"bad udp checksum"),
    eth / ip(chksum=0x1234) / UDP(sport=41001, dport=port) / Raw(b"bad ip checksum"),
    # Truncated headers: IP cut short, UDP header cut short.
    eth / Raw(bytes(ip() / UDP(sport=41001, dport=port))[:16]),
    eth / ip(proto=17) / Raw(udp_header(12)[:4]),
    # Bad lengths: UDP longer than the datagram, shorter than its header;
    # IP total length beyond the frame, below its header.
    eth / ip(proto=17) / Raw(udp_header(400) + b"short"),
    eth / ip(proto=17) / Raw(udp_header(4) + b"tiny length"),
    eth / ip(len=1400) / UDP(sport=41001, dport=port) / Raw(b"ip length too big"),
    eth / ip(len=12) / UDP(sport=41001, dport=port) / Raw(b"ip length too small"),
    eth / ip(ihl=15) / UDP(sport=41001, dport=port),
]
# Overlapping fragments of one datagram (RFC 5722: the whole datagram goes).
body = udp_header(8 + 64) + b"o" * 64
hostile += [
    eth / ip(id=0x1001, proto=17, flags="MF", frag=0) / Raw(body[:48]),
    eth / ip(id=0x1001, proto=17, flags="MF", frag=4) / Raw(b"X" * 16),
    eth / ip(id=0x1001, proto=17, frag=6) / Raw(body[48:]),
]
# Tiny fragments: a 600-byte datagram in 8-byte pieces, more than a datagram
# may have.
body = udp_header(600) + b"t" * 592
for i in range(0, 600, 8):
    hostile.append(eth / ip(id=0x1002, proto=17, flags="MF" if i + 8 < 600 else 0, frag=i // 8) / Raw(body[i : i + 8]))
# ICMP errors quoting garbage, and quoting the echo port with nonsense.
quoted = bytes(IP(src=dst_ip, dst=src_ip, proto=17) / UDP(sport=port, dport=41001))
hostile += [
    eth / ip() / ICMP(type=3, code=3) / Raw(b"\xff" * 28),
    eth / ip() / ICMP(type=3, code=3) / Raw(quoted[:22]),
    eth / ip() / ICMP(type=3, code=4, nexthopmtu=10) / Raw(quoted),
    eth / ip() / ICMP(type=11, code=0) / Raw(b""),
    eth / ip() / ICMP(type=3, code=3, chksum=0x1234) / Raw(quoted),
]
sendp(hostile * 5, iface=iface)
# A flood of unfinished datagrams: heads whose bodies never come.
head = udp_header(8 + 1024) + b"f" * 512
sendp([eth / ip(id=0x2000 + i, proto=17, flags="MF", frag=0) / Raw(head) for i in range(flood)], iface=iface)
ok += echo(b"after")
print("echoed %d/2" % ok)
sys.exit(0 if ok == 2 else 1)
