"""uascale's opc.https binding from a foreign encoder: asyncua's binary
codec (asyncua.ua.ua_binary) posting requests through Python's own
http.client over ssl. GetEndpoints, CreateSession, ActivateSession (None
policy, Anonymous), Read; then Reads until the session's bucket is empty,
which must answer 429 with Retry-After and a BadServerTooBusy ServiceFault
carrying the RetryAfterMs hint.

Usage: https_asyncua.py HOST PORT. Prints one line per check and `OK` at
the end; exits non-zero on the first failure.
"""

import http.client
import math
import ssl
import sys

from asyncua import ua
from asyncua.common.utils import Buffer
from asyncua.ua import ua_binary

HOST, PORT = sys.argv[1], int(sys.argv[2])
CTX = ssl.create_default_context()
# The server's TLS certificate is its self-signed application certificate:
# this harness checks the encoding, not the trust.
CTX.check_hostname = False
CTX.verify_mode = ssl.CERT_NONE
CONN = http.client.HTTPSConnection(HOST, PORT, context=CTX, timeout=10)
HTTPS_PROFILE = "http://opcfoundation.org/UA-Profile/Transport/https-uabinary"


def post(request):
    body = ua_binary.struct_to_binary(request)
    CONN.request("POST", "/", body=body,
                 headers={"Content-Type": "application/octet-stream"})
    resp = CONN.getresponse()
    return resp.status, dict(resp.getheaders()), resp.read()


def decode(data, expected):
    # The encoding id is peeked at first (a ServiceFault or the expected
    # response); the response classes read it again as their TypeId.
    type_id = ua_binary.nodeid_from_binary(Buffer(data))
    if type_id.Identifier == ua.ObjectIds.ServiceFault_Encoding_DefaultBinary:
        return ua_binary.struct_from_binary(ua.ServiceFault, Buffer(data))
    want = getattr(ua.ObjectIds, expected.__name__ + "_Encoding_DefaultBinary")
    assert type_id.Identifier == want, f"{expected.__name__} expected, got {type_id}"
    return ua_binary.struct_from_binary(expected, Buffer(data))


def check(cond, what):
    if not cond:
        print(f"FAIL {what}", flush=True)
        sys.exit(1)
    print(f"ok {what}", flush=True)


url = f"opc.https://{HOST}:{PORT}/"

req = ua.GetEndpointsRequest()
req.Parameters.EndpointUrl = url
status, _, data = post(req)
check(status == 200, "GetEndpoints answered 200")
eps = decode(data, ua.GetEndpointsResponse)
check(isinstance(eps, ua.GetEndpointsResponse), "GetEndpointsResponse decodes")
https_eps = [e for e in eps.Endpoints if e.TransportProfileUri == HTTPS_PROFILE]
check(len(https_eps) >= 1 and https_eps[0].EndpointUrl.startswith("opc.https://"),
      "an https-uabinary endpoint is offered")
tcp_eps = [e for e in eps.Endpoints if e.EndpointUrl.startswith("opc.tcp://")]
check(len(tcp_eps) >= 1, "beside the opc.tcp ones")

req = ua.CreateSessionRequest()
req.Parameters.ClientDescription.ApplicationUri = "urn:asyncua:https:harness"
req.Parameters.ClientDescription.ApplicationType = ua.ApplicationType.Client
req.Parameters.EndpointUrl = url
req.Parameters.SessionName = "python-https"
req.Parameters.ClientNonce = b"\x01" * 32
req.Parameters.RequestedSessionTimeout = 60000
req.Parameters.MaxResponseMessageSize = 0
status, _, data = post(req)
check(status == 200, "CreateSession answered 200")
created = decode(data, ua.CreateSessionResponse)
check(isinstance(created, ua.CreateSessionResponse), "CreateSessionResponse decodes")
token = created.Parameters.AuthenticationToken
check(token.NodeIdType == ua.NodeIdType.ByteString and len(token.Identifier) >= 32,
      "the authentication token is a ByteString of at least 32 bytes")

req = ua.ActivateSessionRequest()
req.RequestHeader.AuthenticationToken = token
anon = ua.AnonymousIdentityToken()
policies = [p for e in https_eps for p in e.UserIdentityTokens
            if p.TokenType == ua.UserTokenType.Anonymous]
anon.PolicyId = policies[0].PolicyId if policies else "anonymous"
req.Parameters.UserIdentityToken = anon
req.Parameters.LocaleIds = ["en"]
status, _, data = post(req)
activated = decode(data, ua.ActivateSessionResponse)
check(status == 200 and isinstance(activated, ua.ActivateSessionResponse),
      "ActivateSession (Anonymous) answered")


def read_request():
    req = ua.ReadRequest()
    req.RequestHeader.AuthenticationToken = token
    rv = ua.ReadValueId()
    rv.NodeId = ua.NodeId(2259)  # Server_ServerStatus_State
    rv.AttributeId = ua.AttributeIds.Value
    req.Parameters.NodesToRead = [rv]
    return req


status, _, data = post(read_request())
read = decode(data, ua.ReadResponse)
check(status == 200 and isinstance(read, ua.ReadResponse), "Read answered")
check(read.Results[0].StatusCode.is_good() and read.Results[0].Value.Value == 0,
      "ServerStatus.State reads Running (0)")

# A session-less token is refused inside a 200, as over opc.tcp.
req = read_request()
req.RequestHeader.AuthenticationToken = ua.NodeId(b"\x00" * 32, 0, ua.NodeIdType.ByteString)
status, _, data = post(req)
fault = decode(data, ua.ReadResponse)
check(status == 200 and isinstance(fault, ua.ServiceFault)
      and fault.ResponseHeader.ServiceResult.value == ua.StatusCodes.BadSessionIdInvalid,
      "an unknown token is a BadSessionIdInvalid ServiceFault")

# Flood until the session's bucket is empty.
for _ in range(200):
    status, headers, data = post(read_request())
    if status == 429:
        break
check(status == 429, "a flood of Reads gets 429")
after = headers.get("Retry-After")
check(after is not None and after.isdigit() and int(after) >= 1, "with Retry-After in whole seconds")
fault = decode(data, ua.ReadResponse)
check(isinstance(fault, ua.ServiceFault)
      and fault.ResponseHeader.ServiceResult.value == ua.StatusCodes.BadServerTooBusy,
      "and a BadServerTooBusy ServiceFault")
hint = None
extra = fault.ResponseHeader.AdditionalHeader
params = getattr(extra, "Parameters", None) or []
for kv in params:
    if kv.Key.Name == "RetryAfterMs":
        hint = kv.Value.Value
check(hint is not None and int(after) == max(1, math.ceil(hint / 1000)),
      "whose RetryAfterMs hint rounds up to the Retry-After")

# Not over HTTP: plain-HTTP errors.
CONN.request("GET", "/")
resp = CONN.getresponse()
resp.read()
check(resp.status == 405, "GET is 405")
print("OK", flush=True)
