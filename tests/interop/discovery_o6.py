"""Discovery against a uascale server with o6 (open62541's C client driven from Python).

usage: discovery_o6.py URL
"""
import sys

import o6
from common import check

NONE_URI = "http://opcfoundation.org/UA/SecurityPolicy#None"



url = sys.argv[1]
client = o6.Client(url)
client.connect(noSession=True)
eps = client.getEndpoints(url)
check(len(eps) == 1, f"one endpoint, got {len(eps)}")
check(eps[0].endpointUrl == url, f"endpoint url {eps[0].endpointUrl}")
check(eps[0].securityPolicyUri == NONE_URI, f"policy {eps[0].securityPolicyUri}")
check([t.policyId for t in eps[0].userIdentityTokens] == ["anonymous"], "anonymous token policy")
servers = client.findServers(url)
check([s.applicationUri for s in servers] == ["urn:uascale:server"], f"FindServers {servers}")
client.disconnect()
print("o6 discovery ok")
