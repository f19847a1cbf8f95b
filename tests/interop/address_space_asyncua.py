"""Namespace 0 and the Server object through Browse, Read and
TranslateBrowsePathsToNodeIds with Python asyncua.

usage: address_space_asyncua.py URL
"""
import asyncio
import datetime
import sys

from asyncua import Client, ua
from common import check, expect_status




async def main(url):
    async with Client(url, timeout=10) as client:
        root = client.nodes.root
        names = sorted([(await c.read_browse_name()).Name for c in await root.get_children()])
        check(names == ["Objects", "Types", "Views"], f"Root children {names}")
        objects = await root.get_child(["0:Objects"])
        check(objects.nodeid == ua.NodeId(85), f"Objects {objects.nodeid}")
        server_children = {(await c.read_browse_name()).Name for c in await client.nodes.server.get_children()}
        for want in ["ServerStatus", "NamespaceArray", "ServerArray", "ServiceLevel", "ServerCapabilities", "Auditing"]:
            check(want in server_children, f"Server has {want}: {sorted(server_children)}")
        # TranslateBrowsePathsToNodeIds down to a variable.
        current = await root.get_child(["0:Objects", "0:Server", "0:ServerStatus", "0:CurrentTime"])
        check(current.nodeid == ua.NodeId(2258), f"CurrentTime {current.nodeid}")
        t1 = await current.read_value()
        await asyncio.sleep(0.05)
        t2 = await current.read_value()
        check(isinstance(t1, datetime.datetime) and t2 > t1, f"CurrentTime ticks {t1} {t2}")
        state = await client.get_node(ua.NodeId(2259)).read_value()
        check(state == ua.ServerState.Running, f"State {state}")
        status = await client.get_node(ua.NodeId(2256)).read_value()
        check(status.BuildInfo.ProductName == "uascale", f"BuildInfo {status.BuildInfo}")
        check(await client.get_node(ua.NodeId(2267)).read_value() == 255, "ServiceLevel")
        check(await client.nodes.server.read_node_class() == ua.NodeClass.Object, "Server NodeClass")
        dn = await client.nodes.server.read_display_name()
        check(dn.Text == "Server", f"DisplayName {dn}")
        # An Argument list converted from the NodeSet's XML.
        args = await client.get_node(ua.NodeId(11493)).read_value()
        check([a.Name for a in args] == ["SubscriptionId"], f"GetMonitoredItems InputArguments {args}")
        # Errors come back per operation with the Part 4 codes.
        await expect_status(client.get_node("ns=0;i=99999999").read_value(), ua.StatusCodes.BadNodeIdUnknown, "unknown node")
        await expect_status(
            client.nodes.server.read_attribute(ua.AttributeIds.Executable),
            ua.StatusCodes.BadAttributeIdInvalid,
            "Executable of an Object",
        )
        await expect_status(root.get_child(["0:Objects", "0:NoSuchChild"]), ua.StatusCodes.BadNoMatch, "bad path")
        # Browse with a small page size walks continuation points (BrowseNext).
        params = ua.BrowseParameters()
        params.RequestedMaxReferencesPerNode = 2
        desc = ua.BrowseDescription()
        desc.NodeId = ua.NodeId(2253)
        desc.BrowseDirection = ua.BrowseDirection.Forward
        desc.ReferenceTypeId = ua.NodeId(33)
        desc.IncludeSubtypes = True
        desc.ResultMask = ua.BrowseResultMask.All
        params.NodesToBrowse = [desc]
        results = await client.uaclient.browse(params)
        refs = list(results[0].References)
        cp = results[0].ContinuationPoint
        check(len(refs) == 2 and cp, f"first page {len(refs)} {cp}")
        while cp:
            nxt = ua.BrowseNextParameters()
            nxt.ReleaseContinuationPoints = False
            nxt.ContinuationPoints = [cp]
            r = (await client.uaclient.browse_next(nxt))[0]
            check(r.StatusCode.is_good(), f"BrowseNext {r.StatusCode}")
            refs += r.References
            cp = r.ContinuationPoint
        names = {r.BrowseName.Name for r in refs}
        check(names >= {"ServerStatus", "NamespaceArray"}, f"paged browse {sorted(names)}")
    print("asyncua address space ok")


asyncio.run(main(sys.argv[1]))
