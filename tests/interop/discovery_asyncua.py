"""Discovery against a uascale server with Python asyncua (a client nobody here wrote).

usage: discovery_asyncua.py URL
Checks GetEndpoints and FindServers answers; exits 1 with a message on a mismatch.
"""
import asyncio
import sys

from asyncua import Client, ua
from common import check

NONE_URI = "http://opcfoundation.org/UA/SecurityPolicy#None"
UATCP = "http://opcfoundation.org/UA-Profile/Transport/uatcp-uasc-uabinary"



async def main(url):
    client = Client(url, timeout=10)
    eps = await client.connect_and_get_server_endpoints()
    check(len(eps) == 1, f"one endpoint, got {len(eps)}")
    ep = eps[0]
    check(ep.EndpointUrl == url, f"endpoint url {ep.EndpointUrl!r} == {url!r}")
    check(ep.SecurityPolicyUri == NONE_URI, f"policy {ep.SecurityPolicyUri}")
    check(ep.SecurityMode == ua.MessageSecurityMode.None_, f"mode {ep.SecurityMode}")
    check(ep.TransportProfileUri == UATCP, f"profile {ep.TransportProfileUri}")
    check([t.TokenType for t in ep.UserIdentityTokens] == [ua.UserTokenType.Anonymous], "anonymous token policy")
    check(ep.Server.ApplicationUri == "urn:uascale:server", f"application uri {ep.Server.ApplicationUri}")
    check(ep.Server.ApplicationType == ua.ApplicationType.Server, "application type Server")
    servers = await client.connect_and_find_servers()
    check([s.ApplicationUri for s in servers] == ["urn:uascale:server"], f"FindServers {servers}")
    check(servers[0].DiscoveryUrls == [url], f"discovery urls {servers[0].DiscoveryUrls}")
    print("asyncua discovery ok")


asyncio.run(main(sys.argv[1]))
