#!/usr/bin/python3
"""The soak's servers, on the private netns's loopback (scripts/soak).

  SRV_PORT on 127.0.0.1   HTTP: / answers "ok", /reset resets the connection, /stall never answers
  UDP_PORT on 127.0.0.1   UDP echo
  canaries                every accept or datagram is one line in CANARY_LOG: the soak's
                          requirement is that the file stays empty (no tenant ever reaches one)
      127.0.0.1:CANARY_PORT  a port no entry names
      127.0.0.2:SRV_PORT     an address no entry names (the allowed port)
      127.0.0.3:SRV_PORT     canary.soak.test in the private /etc/hosts, a name no entry names
      udp 127.0.0.1:CANARY_PORT
  127.0.0.53:53 (udp)     a resolver that reads every query and never answers

Usage: servers.py SRV_PORT UDP_PORT CANARY_PORT CANARY_LOG; prints "ready" once all listen.
"""
import socket
import struct
import sys
import threading
import time

SRV, UDP, CANARY, LOG = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
log_lock = threading.Lock()


def canary_hit(what):
    with log_lock, open(LOG, "a") as f:
        f.write("%.3f %s\n" % (time.time(), what))


def listener(addr, port):
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((addr, port))
    s.listen(256)
    return s


def reset(c):
    # SO_LINGER 0: close sends a RST instead of a FIN
    c.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    c.close()


def http_conn(c):
    try:
        c.settimeout(10)
        req = c.recv(4096).decode("latin-1")
        path = req.split(" ")[1] if " " in req else "/"
        if path == "/reset":
            return reset(c)
        if path == "/stall":
            time.sleep(30)
        else:
            c.sendall(b"HTTP/1.0 200 OK\r\nContent-Length: 3\r\n\r\nok\n")
        c.close()
    except OSError:
        c.close()


def serve_http(s):
    while True:
        c, _ = s.accept()
        threading.Thread(target=http_conn, args=(c,), daemon=True).start()


def serve_canary(s, name):
    while True:
        c, peer = s.accept()
        canary_hit("tcp %s from %s:%d" % (name, peer[0], peer[1]))
        c.close()


def udp_socket(addr, port):
    u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    u.bind((addr, port))
    return u


def serve_udp_echo(u):
    while True:
        data, peer = u.recvfrom(65536)
        u.sendto(data, peer)


def serve_udp_canary(u):
    while True:
        _, peer = u.recvfrom(65536)
        canary_hit("udp 127.0.0.1:%d from %s:%d" % (CANARY, peer[0], peer[1]))


def serve_dns_hang(u):
    while True:
        u.recvfrom(65536)


def main():
    jobs = [(serve_http, (listener("127.0.0.1", SRV),)),
            (serve_udp_echo, (udp_socket("127.0.0.1", UDP),)),
            (serve_udp_canary, (udp_socket("127.0.0.1", CANARY),)),
            (serve_dns_hang, (udp_socket("127.0.0.53", 53),))]
    for addr, port in (("127.0.0.1", CANARY), ("127.0.0.2", SRV), ("127.0.0.3", SRV)):
        jobs.append((serve_canary, (listener(addr, port), "%s:%d" % (addr, port))))
    for fn, args in jobs:
        threading.Thread(target=fn, args=args, daemon=True).start()
    print("ready", flush=True)
    while True:
        time.sleep(3600)


main()
