"""The demo namespace through Read, Write and Call with Python asyncua: every
built-in type scalar and array written and read back, and the status codes
Part 4 prescribes for bad input.

usage: demo_asyncua.py URL
"""
import asyncio
import datetime
import sys
import uuid

from asyncua import Client, ua
from common import check, expect_status

TYPES = {
    "Boolean": (False, ua.VariantType.Boolean),
    "SByte": (-100, ua.VariantType.SByte),
    "Byte": (200, ua.VariantType.Byte),
    "Int16": (-30000, ua.VariantType.Int16),
    "UInt16": (60000, ua.VariantType.UInt16),
    "Int32": (-2000000000, ua.VariantType.Int32),
    "UInt32": (4000000000, ua.VariantType.UInt32),
    "Int64": (-9000000000000000000, ua.VariantType.Int64),
    "UInt64": (18000000000000000000, ua.VariantType.UInt64),
    "Float": (0.25, ua.VariantType.Float),
    "Double": (1e300, ua.VariantType.Double),
    "String": ("grüße", ua.VariantType.String),
    "DateTime": (datetime.datetime(2025, 1, 2, 3, 4, 5, tzinfo=datetime.timezone.utc), ua.VariantType.DateTime),
    "Guid": (uuid.UUID("12345678-1234-5678-1234-567812345678"), ua.VariantType.Guid),
    "ByteString": (b"\x00\x01\xff", ua.VariantType.ByteString),
    "XmlElement": (ua.XmlElement("<b/>"), ua.VariantType.XmlElement),
    "NodeId": (ua.NodeId("x", 2), ua.VariantType.NodeId),
    "ExpandedNodeId": (ua.ExpandedNodeId(2253), ua.VariantType.ExpandedNodeId),
    "StatusCode": (ua.StatusCode(ua.StatusCodes.BadTimeout), ua.VariantType.StatusCode),
    "QualifiedName": (ua.QualifiedName("q", 2), ua.VariantType.QualifiedName),
    "LocalizedText": (ua.LocalizedText("t", "en"), ua.VariantType.LocalizedText),
}



def same(a, b):
    if isinstance(a, datetime.datetime):
        return a.replace(tzinfo=None) == b.replace(tzinfo=None)
    if isinstance(a, ua.StatusCode):
        return a.value == b.value
    return a == b



async def main(url):
    async with Client(url, timeout=10) as client:
        ns = await client.get_namespace_index("urn:uascale:demo")
        check(ns == 2, f"demo namespace index {ns}")
        for name, (value, vt) in TYPES.items():
            node = client.get_node(f"ns=2;s=Demo.Static.Scalar.{name}")
            await node.write_value(ua.DataValue(ua.Variant(value, vt)))
            back = await node.read_value()
            check(same(value, back), f"scalar {name}: wrote {value!r}, read {back!r}")
            arr = client.get_node(f"ns=2;s=Demo.Static.Array.{name}")
            values = [value, value]
            await arr.write_value(ua.DataValue(ua.Variant(values, vt)))
            back = await arr.read_value()
            check(len(back) == 2 and all(same(value, b) for b in back), f"array {name}: {back!r}")
        # Index ranges on arrays.
        arr = client.get_node("ns=2;s=Demo.Static.Array.Int32")
        await arr.write_value(ua.DataValue(ua.Variant([1, 2, 3, 4], ua.VariantType.Int32)))
        params = ua.ReadParameters()
        rv = ua.ReadValueId()
        rv.NodeId = arr.nodeid
        rv.AttributeId = ua.AttributeIds.Value
        rv.IndexRange = "1:2"
        params.NodesToRead = [rv]
        res = await client.uaclient.read(params)
        check(res[0].Value.Value == [2, 3], f"index range read {res[0]}")
        # Bad input gets the Part 4 codes.
        dbl = client.get_node("ns=2;s=Demo.Static.Scalar.Double")
        await expect_status(dbl.write_value(ua.DataValue(ua.Variant("text", ua.VariantType.String))), ua.StatusCodes.BadTypeMismatch, "wrong type")
        await expect_status(dbl.write_value(ua.DataValue(ua.Variant([1.0], ua.VariantType.Double))), ua.StatusCodes.BadTypeMismatch, "array into scalar")
        counter = client.get_node("ns=2;s=Demo.Dynamic.Counter")
        await expect_status(counter.write_value(ua.DataValue(ua.Variant(5, ua.VariantType.UInt32))), ua.StatusCodes.BadNotWritable, "read-only")
        await expect_status(client.get_node("ns=2;s=Nope").read_value(), ua.StatusCodes.BadNodeIdUnknown, "unknown node")
        # Dynamic values change.
        c1 = await counter.read_value()
        await asyncio.sleep(0.6)
        c2 = await counter.read_value()
        check(c2 > c1, f"Counter moves: {c1} -> {c2}")
        # Call with argument checks.
        methods = client.get_node("ns=2;s=Demo.Methods")
        out = await methods.call_method("2:Add", ua.Variant(1.5, ua.VariantType.Double), ua.Variant(2.0, ua.VariantType.Double))
        check(out == 3.5, f"Add -> {out}")
        await expect_status(methods.call_method("2:Add", ua.Variant(1.5, ua.VariantType.Double)), ua.StatusCodes.BadArgumentsMissing, "too few arguments")
        await expect_status(methods.call_method("2:Add", ua.Variant("x", ua.VariantType.String), ua.Variant(2.0, ua.VariantType.Double)), ua.StatusCodes.BadInvalidArgument, "wrong argument type")
        # Operation limits.
        params = ua.ReadParameters()
        params.NodesToRead = [rv] * 10001
        await expect_status(client.uaclient.read(params), ua.StatusCodes.BadTooManyOperations, "10001 reads")
        limit = await client.get_node(ua.NodeId(11705)).read_value()
        check(limit == 10000, f"MaxNodesPerRead {limit}")
    print("asyncua demo ok")


asyncio.run(main(sys.argv[1]))
