"""Python asyncua reads the redundancy surface of a cluster node through
the front end: Server.ServerRedundancy's type definition
(TransparentRedundancyType, i=2036), RedundancySupport (Transparent),
CurrentServerId (the node serving the session) and RedundantServerArray
(every node, with its ServiceLevel and ServerState).

Usage: cluster_redundancy_asyncua.py URL NODE_ID... Exits 0 when
CurrentServerId is one of NODE_IDs and RedundantServerArray lists exactly
NODE_IDs, every one Running and Healthy; prints CurrentServerId.
"""
import asyncio
import sys

from asyncua import Client, ua

from common import check

SERVER_REDUNDANCY = ua.NodeId(2296, 0)
REDUNDANCY_SUPPORT = ua.NodeId(3709, 0)
CURRENT_SERVER_ID = ua.NodeId(11312, 0)
REDUNDANT_SERVER_ARRAY = ua.NodeId(11313, 0)


async def main(url, nodes):
    async with Client(url, timeout=10) as client:
        redundancy = client.get_node(SERVER_REDUNDANCY)
        type_definition = await redundancy.read_type_definition()
        check(
            type_definition == ua.NodeId(2036, 0),
            f"ServerRedundancy is a TransparentRedundancyType: {type_definition}",
        )
        support = await client.get_node(REDUNDANCY_SUPPORT).read_value()
        check(support == ua.RedundancySupport.Transparent, f"RedundancySupport {support}")
        current = await client.get_node(CURRENT_SERVER_ID).read_value()
        check(current in nodes, f"CurrentServerId {current!r} is one of {nodes}")
        # The array is built from the heartbeats: wait for every node.
        for _ in range(100):
            members = await client.get_node(REDUNDANT_SERVER_ARRAY).read_value()
            if sorted(m.ServerId for m in members) == sorted(nodes):
                break
            await asyncio.sleep(0.1)
        check(
            sorted(m.ServerId for m in members) == sorted(nodes),
            f"RedundantServerArray lists {nodes}: {members}",
        )
        for m in members:
            check(isinstance(m, ua.RedundantServerDataType), f"{m!r}")
            check(m.ServerState == ua.ServerState.Running, f"{m.ServerId} Running: {m}")
            check(m.ServiceLevel >= 200, f"{m.ServerId} Healthy: {m}")
        print(current, flush=True)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2:]))
