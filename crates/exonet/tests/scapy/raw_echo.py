"""Drives `exonet raw-echo` from the Linux side of a veth: numbered UDP
datagrams must come back with addresses and ports swapped; then hostile
frames (bad checksums, truncated and impossible headers, runts) that must
not stop it; then one more datagram that must still come back.

usage: raw_echo.py IFACE DST_IP DST_MAC PORT COUNT
Prints "echoed N/M" and exits 0 only if every datagram came back.
"""
import sys

from scapy.all import IP, UDP, Ether, Raw, conf, get_if_addr, get_if_hwaddr, sendp, srp1

iface, dst_ip, dst_mac, port, count = sys.argv[1:6]
port, count = int(port), int(count)
conf.verb = 0
src_ip, src_mac = get_if_addr(iface), get_if_hwaddr(iface)


def echo(i):
    payload = b"exonet-%06d" % i
    q = Ether(src=src_mac, dst=dst_mac) / IP(src=src_ip, dst=dst_ip) / UDP(sport=40000 + i % 1000, dport=port) / Raw(payload)
    r = srp1(q, iface=iface, timeout=2)
    return (
        r is not None
        and UDP in r
        and r[IP].src == dst_ip
        and r[UDP].sport == port
        and r[UDP].dport == q[UDP].sport
        and bytes(r[UDP].payload) == payload
    )


ok = sum(echo(i) for i in range(count))
eth = Ether(src=src_mac, dst=dst_mac)
hostile = [
    eth / IP(src=src_ip, dst=dst_ip, chksum=0x1234) / UDP(dport=port) / Raw(b"bad ip checksum"),
    eth / IP(src=src_ip, dst=dst_ip) / UDP(dport=port, chksum=0x1234) / Raw(b"bad udp checksum"),
    eth / IP(src=src_ip, dst=dst_ip) / UDP(dport=port, len=4000) / Raw(b"udp length too big"),
    eth / IP(src=src_ip, dst=dst_ip, len=9000) / UDP(dport=port) / Raw(b"ip length too big"),
    eth / IP(src=src_ip, dst=dst_ip, ihl=15) / UDP(dport=port),
    eth / IP(src=src_ip, dst=dst_ip, ihl=2) / UDP(dport=port),
    eth / Raw(bytes(IP(src=src_ip, dst=dst_ip) / UDP(dport=port))[:24]),
    Ether(src=src_mac, dst=dst_mac, type=0x0800) / Raw(b"\x45"),
    Raw(b"\x00" * 10),
    eth / IP(src=src_ip, dst=dst_ip, flags="MF", frag=0) / UDP(dport=port) / Raw(b"head"),
    eth / IP(src=src_ip, dst=dst_ip, frag=100, proto=17) / Raw(b"orphan body fragment"),
]
sendp(hostile * 20, iface=iface)
ok += echo(count)
print("echoed %d/%d" % (ok, count + 1))
sys.exit(0 if ok == count + 1 else 1)
