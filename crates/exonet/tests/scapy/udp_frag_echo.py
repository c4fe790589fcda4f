"""Sends one UDP datagram of SIZE bytes to DST_IP:PORT in fragments of at
most 1000 bytes, in shuffled order (never the order of their offsets), from
the port of a Linux UDP socket; the echo must arrive on that socket (Linux
reassembles it) carrying the same bytes.

usage: udp_frag_echo.py IFACE DST_IP DST_MAC PORT SIZE
Prints "echoed SIZE bytes sent in N fragments" and exits 0 on success.
"""
import random
import socket
import sys

from scapy.all import IP, UDP, Ether, Raw, conf, fragment, get_if_addr, get_if_hwaddr, sendp

iface, dst_ip, dst_mac, port, size = sys.argv[1:6]
port, size = int(port), int(size)
conf.verb = 0
src_ip, src_mac = get_if_addr(iface), get_if_hwaddr(iface)

s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind((src_ip, 0))
s.settimeout(5)
sport = s.getsockname()[1]

rng = random.Random(7)
payload = bytes(rng.randrange(256) for _ in range(size))
dgram = IP(src=src_ip, dst=dst_ip, id=0x4242) / UDP(sport=sport, dport=port) / Raw(payload)
frags = fragment(dgram, fragsize=1000)
order = list(range(len(frags)))
while order == sorted(order):
    rng.shuffle(order)
sendp([Ether(src=src_mac, dst=dst_mac) / frags[i] for i in order], iface=iface)

try:
    data, peer = s.recvfrom(65536)
except socket.timeout:
    print("no echo")
    sys.exit(1)
if data != payload or peer != (dst_ip, port):
    print("wrong echo: %d bytes from %s" % (len(data), peer))
    sys.exit(1)
print("echoed %d bytes sent in %d fragments" % (len(data), len(frags)))
