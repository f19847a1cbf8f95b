"""The demo namespace and bad input with o6 (open62541's C client driven
from Python) against a uascale server - the demo checks of the first peer, repeated
with the second.

usage: demo_o6.py URL
GetEndpoints; browse from Root down to the demo variables; ServerStatus;
every Demo.Static scalar and array read, written back and read again (and a
changed Double, String, Boolean and Int32 array); TranslateBrowsePaths; the
Add method; bad input - an unknown node (BadNodeIdUnknown), a value of the
wrong type (BadTypeMismatch), a read-only variable (BadNotWritable), too many
nodes in one Read (BadTooManyOperations), a method with missing arguments
(BadArgumentsMissing) - then a second client is served normally.
"""
import sys

import numpy as np
import o6
import o6.ns.ns0.datatypes as dt
from common import check

url = sys.argv[1]


def expect(code_name, fn, what):
    try:
        r = fn()
    except o6.StatusCodeError as e:
        check(code_name in str(e), f"{what}: got {e}")
        return
    check(code_name in str(r), f"{what}: got {r}")


def name_of(ref):
    return str(ref.browseName.name)


client = o6.Client(url)
client.connect(createDefaultSubscription=False)

endpoints = client.getEndpoints(url)
check(len(endpoints) >= 1, f"endpoints: {endpoints}")

# Root -> Objects -> Demo -> Static -> Scalar, by browsing.
node = "i=84"
for step in ["Objects", "Demo", "Static", "Scalar"]:
    refs = client.browse(node, resultMask=63)
    found = [r for r in refs if name_of(r) == step]
    check(found, f"{step} under {node}: {[name_of(r) for r in refs]}")
    node = found[0].nodeId
scalars = client.browse(node, resultMask=63)
names = sorted(name_of(r) for r in scalars)
for t in ["Boolean", "Byte", "Double", "Int16", "String", "DateTime", "Guid", "ByteString"]:
    check(t in names, f"{t} among the scalars {names}")

status = client.read(2256)
check("currentTime" in str(status) and "uascale" in str(status), f"ServerStatus {status}")

# Every static scalar and array: read, write the same value back, read again.
written = 0
for kind in ["Scalar", "Array"]:
    for t in names:
        nid = f"ns=2;s=Demo.Static.{kind}.{t}"
        try:
            v = client.read(nid)
        except o6.StatusCodeError as e:
            check(False, f"read {nid}: {e}")
        s = client.write(nid, v)
        check("GOOD" in str(s), f"write back {nid} ({type(v).__name__}): {s}")
        again = client.read(nid)
        check(str(again) == str(v), f"{nid}: wrote {v!r}, read {again!r}")
        written += 1
check(written >= 40, f"only {written} variables written")

for nid, value in [
    ("ns=2;s=Demo.Static.Scalar.Double", 2.75),
    ("ns=2;s=Demo.Static.Scalar.String", "from o6"),
    ("ns=2;s=Demo.Static.Scalar.Boolean", True),
    ("ns=2;s=Demo.Static.Array.Int32", np.array([7, -8, 9], dtype=np.int32)),
]:
    s = client.write(nid, value)
    check("GOOD" in str(s), f"write {nid}: {s}")
    back = client.read(nid)
    check(str(back) == str(value), f"{nid}: wrote {value!r}, read {back!r}")

path = dt.BrowsePath(
    startingNode=o6.NodeId("i=85"),
    relativePath=dt.RelativePath("/2:Demo/2:Methods/2:Add"),
)
r = client.translateBrowsePathsToNodeIds(path)
check("GOOD" in str(r) and "Demo.Methods.Add" in str(r), f"translate: {r}")

status, total = client.call("ns=2;s=Demo.Methods", "ns=2;s=Demo.Methods.Add", [1.5, 2.0])
check("GOOD" in str(status) and float(total) == 3.5, f"Add: {status} {total}")

expect("BAD_NODE_ID_UNKNOWN", lambda: client.read("ns=2;s=No.Such.Node"), "unknown node")
expect(
    "BAD_TYPE_MISMATCH",
    lambda: client.write("ns=2;s=Demo.Static.Scalar.Int16", "text"),
    "wrong type",
)
expect("BAD_NOT_WRITABLE", lambda: client.write("i=2258", 1.0), "read-only")
expect(
    "BAD_TOO_MANY_OPERATIONS",
    lambda: client.read(["i=2258"] * 10_001),
    "too many nodes",
)
expect(
    "BAD_ARGUMENTS_MISSING",
    lambda: client.call("ns=2;s=Demo.Methods", "ns=2;s=Demo.Methods.Add", [1.5]),
    "missing argument",
)
client.disconnect()

# The server keeps serving.
other = o6.Client(url)
other.connect(createDefaultSubscription=False)
check(float(other.read("ns=2;s=Demo.Static.Scalar.Double")) == 2.75, "second client")
other.disconnect()
print("o6 demo ok")
