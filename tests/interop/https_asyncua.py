"""uascale's opc.https binding from a foreign encoder: asyncua's binary
codec (asyncua.ua.ua_binary) posting requests through Python's own
http.client over ssl. GetEndpoints, CreateSession, ActivateSession (None
policy, Anonymous), Read; then Reads until the session's bucket is empty,
which must answer 429 with Retry-After and a BadServerTooBusy ServiceFault
carrying the RetryAfterMs hint.

Besides the decoded values, the bytes both ways:
- each request body is asyncua's encoding of the request object - its
  binary encoding id first, and decoding it gives back a request that
  encodes to the same bytes - and carries a requestHandle of its own that
  the answer must echo (the server decoded those bytes);
- each answer body (NodeId and structure), decoded by asyncua and encoded
  again by asyncua, is byte for byte the body uascale sent.
Two things asyncua's decoding loses are kept beside what it decodes, so
that its re-encoding can be exact: a DateTime becomes a Python datetime,
whose resolution is a microsecond, not OPC UA's 100 ns (the ticks read
are kept and encoded); and a DataValue sent without a StatusCode (Good,
omitted as Part 6 allows) gets asyncua's default Good, which it would then
encode (the StatusCode is left absent).

Usage: https_asyncua.py HOST PORT. Prints one line per check and `OK` at
the end; exits non-zero on the first failure.
"""

import datetime
import http.client
import math
import ssl
import struct
import sys

from asyncua import ua
from asyncua.common.utils import Buffer
from asyncua.ua import ua_binary


class Ticks(datetime.datetime):
    """A decoded DateTime that keeps its 100 ns ticks (see above)."""

    ticks = None


def _unpack_datetime(data):
    ticks = ua_binary.Primitives.Int64.unpack(data)
    dt = ua.win_epoch_to_datetime(ticks)
    kept = Ticks(dt.year, dt.month, dt.day, dt.hour, dt.minute, dt.second,
                 dt.microsecond, tzinfo=dt.tzinfo)
    kept.ticks = ticks
    return kept


_pack_datetime = ua_binary._DateTime.pack


def _pack_kept_ticks(dt):
    ticks = getattr(dt, "ticks", None)
    if ticks is None:
        return _pack_datetime(dt)
    return ua_binary.Primitives.Int64.pack(ticks)


_dataclass_deserializer = ua_binary._create_dataclass_deserializer
DATA_VALUE_HAS_STATUS = 0x02


def _dataclass_deserializer_keeping_absence(objtype):
    decode = _dataclass_deserializer(objtype)
    if objtype is not ua.DataValue:
        return decode

    def decode_data_value(data):
        mask = data.copy(1).read(1)[0]
        value = decode(data)
        if not mask & DATA_VALUE_HAS_STATUS:
            object.__setattr__(value, "StatusCode", None)
        return value

    return decode_data_value


# Before any encoding or decoding: asyncua builds and caches its
# (de)serializers from these on first use.
ua_binary._DateTime.unpack = staticmethod(_unpack_datetime)
ua_binary._DateTime.pack = staticmethod(_pack_kept_ticks)
ua_binary._create_dataclass_deserializer = _dataclass_deserializer_keeping_absence

HOST, PORT = sys.argv[1], int(sys.argv[2])
CTX = ssl.create_default_context()
# The server's TLS certificate is its self-signed application certificate:
# this harness checks the encoding, not the trust.
CTX.check_hostname = False
CTX.verify_mode = ssl.CERT_NONE
CONN = http.client.HTTPSConnection(HOST, PORT, context=CTX, timeout=10)
HTTPS_PROFILE = "http://opcfoundation.org/UA-Profile/Transport/https-uabinary"


def check(cond, what):
    if not cond:
        print(f"FAIL {what}", flush=True)
        sys.exit(1)
    print(f"ok {what}", flush=True)


LAST_HANDLE = 0
# The requestHandle of the last request posted, for decode() to check.
SENT_HANDLE = None


def post(request, quiet=False):
    """POSTs asyncua's encoding of `request` with a requestHandle of its
    own, after checking those bytes are that encoding."""
    global LAST_HANDLE, SENT_HANDLE
    LAST_HANDLE += 1
    request.RequestHeader.RequestHandle = LAST_HANDLE
    SENT_HANDLE = LAST_HANDLE
    body = ua_binary.struct_to_binary(request)
    name = type(request).__name__
    encoding_id = getattr(ua.ObjectIds, name + "_Encoding_DefaultBinary")
    again = ua_binary.struct_from_binary(type(request), Buffer(body))
    good = (body[:4] == b"\x01\x00" + struct.pack("<H", encoding_id)
            and ua_binary.struct_to_binary(again) == body
            and again.RequestHeader.RequestHandle == LAST_HANDLE)
    if not quiet or not good:
        check(good, f"the {name} sent is asyncua's encoding of it "
                    f"(encoding id {encoding_id} first, re-encodes the same)")
    CONN.request("POST", "/", body=body,
                 headers={"Content-Type": "application/octet-stream"})
    resp = CONN.getresponse()
    return resp.status, dict(resp.getheaders()), resp.read()


def decode(data, expected, quiet=False):
    """The answer `data` decoded by asyncua - the expected response or a
    ServiceFault - after checking that asyncua's encoding of what it
    decoded is `data` byte for byte, and that it echoes the requestHandle
    of the request posted last."""
    # The encoding id is peeked at first (a ServiceFault or the expected
    # response); the response classes read it again as their TypeId.
    type_id = ua_binary.nodeid_from_binary(Buffer(data))
    if type_id.Identifier == ua.ObjectIds.ServiceFault_Encoding_DefaultBinary:
        kind = ua.ServiceFault
    else:
        want = getattr(ua.ObjectIds, expected.__name__ + "_Encoding_DefaultBinary")
        assert type_id.Identifier == want, f"{expected.__name__} expected, got {type_id}"
        kind = expected
    decoded = ua_binary.struct_from_binary(kind, Buffer(data))
    again = ua_binary.struct_to_binary(decoded)
    if again != data:
        at = next((i for i, (a, b) in enumerate(zip(again, data)) if a != b),
                  min(len(again), len(data)))
        print(f"  received    {data[max(0, at - 16):at + 16].hex()}\n"
              f"  re-encoded  {again[max(0, at - 16):at + 16].hex()}  (at byte {at} of "
              f"{len(data)} / {len(again)})", flush=True)
    good = again == data and decoded.ResponseHeader.RequestHandle == SENT_HANDLE
    if not quiet or not good:
        check(good, f"the {kind.__name__} received ({len(data)} bytes) is asyncua's "
                    f"re-encoding of it, echoing requestHandle {SENT_HANDLE}")
    return decoded


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
# An absent StatusCode is Good (see above).
status = read.Results[0].StatusCode
check((status is None or status.is_good()) and read.Results[0].Value.Value == 0,
      "ServerStatus.State reads Running (0)")

# A session-less token is refused inside a 200, as over opc.tcp.
req = read_request()
req.RequestHeader.AuthenticationToken = ua.NodeId(b"\x00" * 32, 0, ua.NodeIdType.ByteString)
status, _, data = post(req)
fault = decode(data, ua.ReadResponse)
check(status == 200 and isinstance(fault, ua.ServiceFault)
      and fault.ResponseHeader.ServiceResult.value == ua.StatusCodes.BadSessionIdInvalid,
      "an unknown token is a BadSessionIdInvalid ServiceFault")

# Flood until the session's bucket is empty (each answer's bytes checked
# too, quietly unless they fail).
for _ in range(200):
    status, headers, data = post(read_request(), quiet=True)
    if status == 429:
        break
    decode(data, ua.ReadResponse, quiet=True)
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
