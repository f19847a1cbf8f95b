"""Sessions, Read, Browse and subscriptions against a uascale server with o6
(open62541's C client driven from Python).

usage: session_o6.py URL
The server runs with --rate-ms 100. o6's connect() creates a session and a
default subscription; then a Read, a Browse of the Objects folder, a data
change subscription on ns=2;s=Demo.Dynamic.Counter (queue of 10: every change, in
order) and an event subscription on the Server object with a where clause
(only events with Severity > 700).
"""
import sys
import threading
import time

import o6
from common import check

url = sys.argv[1]
client = o6.Client(url)
client.connect()

ns = client.read(2255)
check(list(ns)[:3] == ["http://opcfoundation.org/UA/", "urn:uascale:server", "urn:uascale:demo"], f"NamespaceArray {ns}")
refs = client.browse(85, resultMask=63)
names = {str(r.browseName.name) for r in refs}
check({"Server", "Demo"} <= names, f"Objects folder: {names}")

lock = threading.Lock()
values = []
events = []


def on_value(item, value):
    with lock:
        values.append(value)


def on_event(item, fields):
    with lock:
        events.append(fields)


# A queue of 10, as the asyncua test asks: the counter is pushed every
# 100 ms and o6's default subscription publishes about as often, so with a
# queue of one a publishing cycle that spans two ticks keeps only the newer
# value (Part 4's queue of one is the latest value), and "every change"
# would depend on timer jitter.
client.monitor("ns=2;s=Demo.Dynamic.Counter", on_value, samplingInterval=100, queueSize=10)
client.monitorEvent(
    2253,
    on_event,
    "SELECT /Message, /Severity WHERE /Severity > 700",
)
time.sleep(3.0)
with lock:
    v = list(values)
    e = list(events)
check(len(v) >= 15, f"about 30 changes in 3 s, got {len(v)}: {v}")
gaps = [(a, b) for a, b in zip(v, v[1:]) if b != a + 1]
check(not gaps, f"every change delivered in order: gaps {gaps} in {v}")
sev = [f.get("/Severity") for f in e]
check(len(e) >= 3, f"some matching events in 3 s: {e}")
check(all(s is not None and int(s) > 700 for s in sev), f"only Severity > 700: {sev}")
client.disconnect()
print("o6 session ok")
