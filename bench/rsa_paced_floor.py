"""The RSA floor at a client's pace: CPU per RSA-2048 signature (OpenSSL,
through the `cryptography` package) done back to back, and with the core
left idle for GAP ms before each one, as a server that waits on a slow
client is (docs/notebook/benchmarks.md, "Item 1, with Python asyncua as the
client").

usage: rsa_paced_floor.py [N [GAP_MS ...]]

N signatures per round (default 300), a back-to-back round around every
paced one (default gaps 5 and 20 ms). Prints the mean and median thread
CPU per signature of each round. Pin it to the server's core, e.g.
`taskset -c 0 target/venv/bin/python bench/rsa_paced_floor.py 300 20`.
"""
import sys
import time

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import padding, rsa

n = int(sys.argv[1]) if len(sys.argv) > 1 else 300
gaps = [float(g) / 1000 for g in sys.argv[2:]] or [0.005, 0.020]
key = rsa.generate_private_key(public_exponent=65537, key_size=2048)


def run(gap):
    cpu = []
    for _ in range(n):
        if gap:
            time.sleep(gap)
        c0 = time.thread_time()
        key.sign(b"x" * 100, padding.PKCS1v15(), hashes.SHA256())
        cpu.append(time.thread_time() - c0)
    cpu.sort()
    return 1000 * sum(cpu) / n, 1000 * cpu[n // 2]


for gap in [0.0] + [x for g in gaps for x in (g, 0.0)]:
    mean, median = run(gap)
    print(f"idle {1000 * gap:4.0f} ms before each: {mean:.3f} ms mean, "
          f"{median:.3f} ms median CPU per signature")
