"""Secured (or None) sessions opened by Python asyncua against a server, to
measure the server's CPU per session with a client nobody here wrote
(docs/notebook/benchmarks.md, "Item 1, with Python asyncua as the client").

usage: asyncua_sessions.py URL N C PID none|secure [HOLD_S [PKI SERVER_PKI]]

N sessions, C connecting at once, Basic256Sha256 SignAndEncrypt with the
client certificate PKI/own/certs/cert.der and key PKI/own/private/key.pem
and the server certificate SERVER_PKI/own/certs/cert.der (defaults
pki-client and pki; the server must trust the client, e.g.
trust_all_client_certificates). The client's ApplicationUri is
urn:uascale:client, the URI `uascale` client certificates carry. Prints the
server's CPU (from /proc/PID/stat) per session established, per second
held and per session closed, and the establishment alone: the CPU of the
ramp less the steady cost (per session-second, measured while held) of
the sessions already up. Run it from the repository's venv
(target/venv/bin/python, which `.ci/run` creates).
"""
import asyncio
import os
import sys
import time

from asyncua import Client, ua
from asyncua.crypto import security_policies as sp

url, n, c, pid, mode = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
hold = float(sys.argv[6]) if len(sys.argv) > 6 else 2.0
pki = sys.argv[7] if len(sys.argv) > 7 else "pki-client"
server_pki = sys.argv[8] if len(sys.argv) > 8 else "pki"
TICK = os.sysconf("SC_CLK_TCK")


def cpu():
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


async def one(gate, clients, up):
    async with gate:
        client = Client(url, timeout=30)
        client.application_uri = "urn:uascale:client"
        if mode == "secure":
            await client.set_security(
                sp.SecurityPolicyBasic256Sha256,
                f"{pki}/own/certs/cert.der",
                f"{pki}/own/private/key.pem",
                server_certificate=f"{server_pki}/own/certs/cert.der",
                mode=ua.MessageSecurityMode.SignAndEncrypt,
            )
        await client.connect()
        clients.append(client)
        up.append(time.time())


async def main():
    gate = asyncio.Semaphore(c)
    clients, up = [], []
    c0, t0 = cpu(), time.time()
    await asyncio.gather(*(one(gate, clients, up) for _ in range(n)))
    c1, t1 = cpu(), time.time()
    print(f"established {len(clients)} in {t1 - t0:.2f} s; "
          f"server CPU {1000 * (c1 - c0) / n:.3f} ms per session")
    await asyncio.sleep(hold)
    c2 = cpu()
    print(f"held {hold} s: server CPU {1000 * (c2 - c1) / hold:.1f} ms per second")
    # The sessions already up kept costing while the rest connected (asyncua
    # reads ServerStatus.State of each once a second): that steady cost,
    # measured while held, per session-second of the ramp, is not
    # establishment.
    steady = (c2 - c1) / hold / n
    ramp = sum(t1 - t for t in up)
    print(f"steady {1e6 * steady:.1f} us per session-second x {ramp:.0f} session-seconds "
          f"in the ramp; establishment alone {1000 * ((c1 - c0) - steady * ramp) / n:.3f} "
          f"ms per session")
    for client in clients:
        await client.disconnect()
    c3 = cpu()
    print(f"closed: {1000 * (c3 - c2) / n:.3f} ms per session; "
          f"all: {1000 * (c3 - c0) / n:.3f} ms per session")


asyncio.run(main())
