#!/usr/bin/env python3
"""Generate OPC UA binary test vectors with a real peer encoder (asyncua).

The files land in ``asyncua/`` beside this script (or ``--out DIR``) and are
decoded by uascale's Rust tests.  Every value is fixed (timestamps, nonces,
GUIDs), so the output is byte-for-byte reproducible.

    target/venv/bin/python tests/vectors/gen_asyncua.py            # (re)write
    target/venv/bin/python tests/vectors/gen_asyncua.py --check    # compare
    target/venv/bin/python tests/vectors/gen_asyncua.py --crosscheck-o6

``--check`` regenerates into a temporary directory and exits 1, naming the
file, when anything differs from the committed vectors.

``--crosscheck-o6`` (needs the optional ``o6`` package, built on open62541)
decodes every vector with a second, independent stack and re-encodes it,
expecting identical bytes except for the differences it knows about.

asyncua 2.1.0 departs from OPC UA Part 6 in two places that matter here (see
README.md): DataValue picosecond placement and the DiagnosticInfo
Locale/LocalizedText mask bits, plus it cannot encode a nested
DiagnosticInfo at all.  For those cases the spec-conformant vector is
assembled from asyncua's own field encoders, and asyncua's whole-struct
output is kept beside it as a ``quirk_*`` file.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import sys
import tempfile
import uuid
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path

REQUIRED_ASYNCUA = "2.1.0"

try:
    from asyncua import ua
    from asyncua.ua import ua_binary as uab
except ImportError:  # pragma: no cover - environment problem
    sys.exit(
        "gen_asyncua.py: asyncua is not installed; run\n"
        "  python3 -m venv target/venv && target/venv/bin/pip install -r tests/requirements.txt"
    )

HERE = Path(__file__).resolve().parent
DEFAULT_OUT = HERE / "asyncua"

# ---------------------------------------------------------------- constants --
UTC = timezone.utc
T_HEADER = datetime(2024, 5, 1, 12, 0, 0, tzinfo=UTC)  # 133590384000000000
T_SOURCE = datetime(2024, 5, 1, 12, 0, 0, tzinfo=UTC)  # 133590384000000000
T_SERVER = datetime(2024, 5, 1, 12, 0, 1, 500000, tzinfo=UTC)  # 133590384015000000
T_PUBLISH = datetime(2024, 5, 1, 12, 0, 2, tzinfo=UTC)  # 133590384020000000

GUID = uuid.UUID("72962b91-fa75-4ae6-8d28-b404dc7daf63")
CLIENT_NONCE = bytes(range(0x00, 0x20))  # 00 01 02 ... 1f
CONTINUATION_POINT = bytes([0xDE, 0xAD, 0xBE, 0xEF])
DEMO_NS_URI = "http://uascale.test/demo"

SC_GOOD = 0x00000000
SC_BAD_NODE_ID_UNKNOWN = 0x80340000
SC_BAD_SEQUENCE_NUMBER_UNKNOWN = 0x807A0000
SC_BAD_UNEXPECTED_ERROR = 0x80010000
SC_UNCERTAIN_INITIAL_VALUE = 0x40920000


def _sanity() -> None:
    assert ua.StatusCodes.BadNodeIdUnknown == SC_BAD_NODE_ID_UNKNOWN
    assert ua.StatusCodes.BadSequenceNumberUnknown == SC_BAD_SEQUENCE_NUMBER_UNKNOWN
    assert ua.StatusCodes.BadUnexpectedError == SC_BAD_UNEXPECTED_ERROR
    assert ua.StatusCodes.UncertainInitialValue == SC_UNCERTAIN_INITIAL_VALUE
    assert ua.datetime_to_win_epoch(T_HEADER) == 133590384000000000
    assert ua.datetime_to_win_epoch(T_SERVER) == 133590384015000000
    assert ua.datetime_to_win_epoch(T_PUBLISH) == 133590384020000000


# ------------------------------------------------------------------ helpers --
def service_body(msg: object) -> bytes:
    """Body of a service message: asyncua's struct encoding minus its TypeId.

    asyncua's generated request/response classes carry the DefaultBinary
    encoding NodeId as their first field (``TypeId``), so ``struct_to_binary``
    yields "encoding NodeId + body".  Strip the prefix after checking it.
    """
    full = uab.struct_to_binary(msg)
    prefix = uab.nodeid_to_binary(msg.TypeId)
    assert full.startswith(prefix), type(msg).__name__
    return full[len(prefix) :]


def encoding_id(name: str) -> ua.NodeId:
    return ua.FourByteNodeId(getattr(ua.ObjectIds, f"{name}_Encoding_DefaultBinary"))


def request_header(handle: int, token: ua.NodeId) -> ua.RequestHeader:
    return ua.RequestHeader(
        AuthenticationToken=token,
        Timestamp=T_HEADER,
        RequestHandle=handle,
        ReturnDiagnostics=0,
        AuditEntryId=None,
        TimeoutHint=10000,
        AdditionalHeader=ua.ExtensionObject(),
    )


def response_header(handle: int, string_table: list[str] | None) -> ua.ResponseHeader:
    return ua.ResponseHeader(
        Timestamp=T_HEADER,
        RequestHandle=handle,
        ServiceResult=ua.StatusCode(SC_GOOD),
        ServiceDiagnostics=ua.DiagnosticInfo(),
        StringTable=string_table,
        AdditionalHeader=ua.ExtensionObject(),
    )


# ------------------------------------------------------------------ vectors --
def _read_request() -> ua.ReadRequest:
    req = ua.ReadRequest()
    req.RequestHeader = request_header(42, ua.NodeId(1234567, 0))
    req.Parameters = ua.ReadParameters(
        MaxAge=0.0,
        TimestampsToReturn=ua.TimestampsToReturn.Both,
        NodesToRead=[
            ua.ReadValueId(NodeId=ua.NodeId(2258, 0), AttributeId=ua.AttributeIds.Value),
            ua.ReadValueId(
                NodeId=ua.NodeId("Demo.Static.Scalar.Double", 2),
                AttributeId=ua.AttributeIds.Value,
                IndexRange="1:2",
            ),
            ua.ReadValueId(
                NodeId=ua.NodeId(GUID, 1),
                AttributeId=ua.AttributeIds.DisplayName,
                DataEncoding=ua.QualifiedName("Default Binary", 0),
            ),
        ],
    )
    assert req.Parameters.NodesToRead[0].NodeId.NodeIdType == ua.NodeIdType.FourByte
    assert req.RequestHeader.AuthenticationToken.NodeIdType == ua.NodeIdType.Numeric
    return req


def read_request() -> bytes:
    return service_body(_read_request())


def read_request_msg() -> bytes:
    req = _read_request()
    assert req.TypeId == encoding_id("ReadRequest")
    out = uab.nodeid_to_binary(encoding_id("ReadRequest")) + service_body(req)
    assert out == uab.struct_to_binary(req)
    return out


def read_response() -> bytes:
    dv_double = ua.DataValue(
        ua.Variant(3.5, ua.VariantType.Double),
        SourceTimestamp=T_SOURCE,
        ServerTimestamp=T_SERVER,
    )  # StatusCode keeps asyncua's default StatusCode(Good) -> mask 0x0F
    dv_bad = ua.DataValue(StatusCode=ua.StatusCode(SC_BAD_NODE_ID_UNKNOWN))
    dv_bad.Value = None  # asyncua turns Value=None into Variant(None); drop it
    dv_text = ua.DataValue(
        ua.Variant(ua.LocalizedText("Hello", "en"), ua.VariantType.LocalizedText),
        StatusCode=None,
    )
    resp = ua.ReadResponse()
    resp.ResponseHeader = response_header(42, ["uascale"])
    resp.Results = [dv_double, dv_bad, dv_text]
    resp.DiagnosticInfos = []
    return service_body(resp)


def create_session_request() -> bytes:
    req = ua.CreateSessionRequest()
    req.RequestHeader = request_header(1, ua.NodeId(0, 0))
    req.Parameters = ua.CreateSessionParameters(
        ClientDescription=ua.ApplicationDescription(
            ApplicationUri="urn:test:client",
            ProductUri="urn:test:product",
            ApplicationName=ua.LocalizedText("uascale vector client", "en"),
            ApplicationType=ua.ApplicationType.Client,
            GatewayServerUri=None,
            DiscoveryProfileUri=None,
            DiscoveryUrls=None,
        ),
        ServerUri=None,
        EndpointUrl="opc.tcp://localhost:4840",
        SessionName="vector-session",
        ClientNonce=CLIENT_NONCE,
        ClientCertificate=None,
        RequestedSessionTimeout=60000.0,
        MaxResponseMessageSize=0,
    )
    return service_body(req)


def browse_response() -> bytes:
    server_ref = ua.ReferenceDescription(
        ReferenceTypeId=ua.NodeId(ua.ObjectIds.Organizes, 0),
        IsForward=True,
        NodeId=ua.ExpandedNodeId(2253, 0),
        BrowseName=ua.QualifiedName("Server", 0),
        DisplayName=ua.LocalizedText("Server", "en"),
        NodeClass=ua.NodeClass.Object,
        TypeDefinition=ua.ExpandedNodeId(ua.ObjectIds.ServerType, 0),
    )
    demo_ref = ua.ReferenceDescription(
        ReferenceTypeId=ua.NodeId(ua.ObjectIds.Organizes, 0),
        IsForward=False,
        NodeId=ua.ExpandedNodeId("Demo", 2, NamespaceUri=DEMO_NS_URI, ServerIndex=1),
        BrowseName=ua.QualifiedName("Demo", 2),
        DisplayName=ua.LocalizedText("Demo"),
        NodeClass=ua.NodeClass.Variable,
        TypeDefinition=ua.ExpandedNodeId(ua.ObjectIds.BaseDataVariableType, 0),
    )
    resp = ua.BrowseResponse()
    resp.ResponseHeader = response_header(43, None)
    resp.Results = [
        ua.BrowseResult(
            StatusCode=ua.StatusCode(SC_GOOD),
            ContinuationPoint=CONTINUATION_POINT,
            References=[server_ref, demo_ref],
        )
    ]
    resp.DiagnosticInfos = []
    return service_body(resp)


def publish_response() -> bytes:
    dcn = ua.DataChangeNotification(
        MonitoredItems=[
            ua.MonitoredItemNotification(
                ClientHandle=1,
                Value=ua.DataValue(ua.Variant(5, ua.VariantType.Int32), SourceTimestamp=T_SOURCE),
            ),
            ua.MonitoredItemNotification(
                ClientHandle=2,
                Value=ua.DataValue(ua.Variant("x", ua.VariantType.String), StatusCode=None),
            ),
        ],
        DiagnosticInfos=None,
    )
    assert ua.typeid_by_extension_objects[ua.DataChangeNotification] == encoding_id("DataChangeNotification")
    resp = ua.PublishResponse()
    resp.ResponseHeader = response_header(44, None)
    resp.Parameters = ua.PublishResult(
        SubscriptionId=7,
        AvailableSequenceNumbers=[1, 2],
        MoreNotifications=False,
        NotificationMessage=ua.NotificationMessage(
            SequenceNumber=2,
            PublishTime=T_PUBLISH,
            NotificationData=[dcn],
        ),
        Results=[ua.StatusCode(SC_GOOD), ua.StatusCode(SC_BAD_SEQUENCE_NUMBER_UNKNOWN)],
        DiagnosticInfos=None,
    )
    return service_body(resp)


def _all_bits_datavalue() -> ua.DataValue:
    return ua.DataValue(
        ua.Variant(7, ua.VariantType.UInt16),
        ua.StatusCode(SC_UNCERTAIN_INITIAL_VALUE),
        SourceTimestamp=T_SOURCE,
        ServerTimestamp=T_SERVER,
        SourcePicoseconds=1234,
        ServerPicoseconds=5678,
    )


def quirk_datavalue_picoseconds_order() -> bytes:
    """asyncua's own DataValue encoder, verbatim (NOT Part 6 conformant)."""
    out = uab.struct_to_binary(_all_bits_datavalue())
    assert out == uab.to_binary(ua.DataValue, _all_bits_datavalue())
    return out


def datavalue_all_bits() -> bytes:
    """Part 6 5.2.2.17 order, built from asyncua's field encoders.

    asyncua 2.1.0 writes SourceTimestamp, ServerTimestamp, SourcePicoseconds,
    ServerPicoseconds; the spec order is SourceTimestamp, SourcePicoseconds,
    ServerTimestamp, ServerPicoseconds.  The mask bits agree.
    """
    dv = _all_bits_datavalue()
    p = uab.Primitives
    head = p.Byte.pack(0x3F) + uab.variant_to_binary(dv.Value) + p.UInt32.pack(dv.StatusCode.value)
    spec = head + (
        p.DateTime.pack(dv.SourceTimestamp)
        + p.UInt16.pack(dv.SourcePicoseconds)
        + p.DateTime.pack(dv.ServerTimestamp)
        + p.UInt16.pack(dv.ServerPicoseconds)
    )
    asyncua_order = head + (
        p.DateTime.pack(dv.SourceTimestamp)
        + p.DateTime.pack(dv.ServerTimestamp)
        + p.UInt16.pack(dv.SourcePicoseconds)
        + p.UInt16.pack(dv.ServerPicoseconds)
    )
    native = quirk_datavalue_picoseconds_order()
    if native == spec:  # pragma: no cover - would mean asyncua fixed it
        return spec
    assert native == asyncua_order, "asyncua DataValue layout changed; revisit gen_asyncua.py"
    return spec


def variant_multidim() -> bytes:
    var = ua.Variant([[1, 2, 3], [4, 5, 6]], ua.VariantType.Int32)
    assert var.Dimensions == [2, 3]
    explicit = ua.Variant([1, 2, 3, 4, 5, 6], ua.VariantType.Int32, Dimensions=[2, 3])
    out = uab.variant_to_binary(var)
    assert out == uab.variant_to_binary(explicit)
    assert out[0] == 0x80 | 0x40 | ua.VariantType.Int32.value
    return out


def variant_array_string() -> bytes:
    out = uab.variant_to_binary(ua.Variant(["alpha", None, ""], ua.VariantType.String))
    assert out[0] == 0x80 | ua.VariantType.String.value
    return out


def expanded_nodeid() -> bytes:
    node = ua.ExpandedNodeId("Demo.Dynamic", 0, NamespaceUri=DEMO_NS_URI, ServerIndex=3)
    out = uab.nodeid_to_binary(node)
    assert out[0] == 0x80 | 0x40 | ua.NodeIdType.String.value
    return out


def diagnostic_info() -> bytes:
    """Outer DiagnosticInfo with all seven fields, nesting an inner one.

    asyncua types InnerDiagnosticInfo as an ExtensionObject and raises
    KeyError when given a DiagnosticInfo, so the inner one is appended by
    hand: outer fields (asyncua) + mask bit 0x40 + inner (asyncua).  With both
    Locale and LocalizedText present asyncua's swapped mask bits coincide with
    the spec's, and the inner one sets neither.
    """
    inner = ua.DiagnosticInfo(SymbolicId=5, AdditionalInfo="inner")
    outer = ua.DiagnosticInfo(
        SymbolicId=1,
        NamespaceURI=2,
        Locale=3,
        LocalizedText=4,
        AdditionalInfo="outer",
        InnerStatusCode=ua.StatusCode(SC_BAD_UNEXPECTED_ERROR),
    )
    try:
        uab.struct_to_binary(ua.DiagnosticInfo(SymbolicId=1, InnerDiagnosticInfo=inner))
    except KeyError:
        pass
    else:  # pragma: no cover - would mean asyncua fixed it
        raise AssertionError("asyncua now encodes nested DiagnosticInfo; revisit gen_asyncua.py")
    body = bytearray(uab.struct_to_binary(outer))
    assert body[0] == 0x3F
    body[0] |= 0x40
    return bytes(body) + uab.struct_to_binary(inner)


def quirk_diagnosticinfo_locale_only() -> bytes:
    """asyncua sets mask bit 0x04 for Locale; Part 6 says 0x08 (0x04 is LocalizedText)."""
    out = uab.struct_to_binary(ua.DiagnosticInfo(Locale=3))
    assert out == bytes([0x04, 3, 0, 0, 0]), out.hex()
    return out


VECTORS: dict[str, Callable[[], bytes]] = {
    "read_request.bin": read_request,
    "read_request_msg.bin": read_request_msg,
    "read_response.bin": read_response,
    "create_session_request.bin": create_session_request,
    "browse_response.bin": browse_response,
    "publish_response.bin": publish_response,
    "datavalue_all_bits.bin": datavalue_all_bits,
    "variant_multidim.bin": variant_multidim,
    "variant_array_string.bin": variant_array_string,
    "expanded_nodeid.bin": expanded_nodeid,
    "diagnostic_info.bin": diagnostic_info,
    "quirk_datavalue_picoseconds_order.bin": quirk_datavalue_picoseconds_order,
    "quirk_diagnosticinfo_locale_only.bin": quirk_diagnosticinfo_locale_only,
}


# ---------------------------------------------------------------- o6 check --
O6_TYPES = {
    "read_request.bin": "ReadRequest",
    "read_request_msg.bin": None,  # NodeId prefix + ReadRequest; checked below
    "read_response.bin": "ReadResponse",
    "create_session_request.bin": "CreateSessionRequest",
    "browse_response.bin": "BrowseResponse",
    "publish_response.bin": "PublishResponse",
    "datavalue_all_bits.bin": "DataValue",
    "variant_multidim.bin": "Variant",
    "variant_array_string.bin": "Variant",
    "expanded_nodeid.bin": "ExpandedNodeId",
    "diagnostic_info.bin": "DiagnosticInfo",
    "quirk_datavalue_picoseconds_order.bin": "DataValue",
    "quirk_diagnosticinfo_locale_only.bin": "DiagnosticInfo",
}


# Vectors whose o6 round trip is expected to differ, as (from, to) byte
# substitutions that turn the vector into what o6 re-encodes.
O6_EXPECTED_REWRITES = {
    # Part 6 5.2.2.10: with a NamespaceUri the encoder shall write
    # NamespaceIndex 0; asyncua writes the index it was given (2).
    "browse_response.bin": (b"\xc3\x02\x00\x04\x00\x00\x00Demo", b"\xc3\x00\x00\x04\x00\x00\x00Demo"),
}


def crosscheck_o6(files: dict[str, bytes]) -> int:
    """Decode each vector with o6 (open62541) and re-encode; report surprises."""
    try:
        import o6
        from o6.ns.ns0 import datatypes as dt
    except ImportError:
        print("o6 is not installed; skipping the cross-check", file=sys.stderr)
        return 0

    def decode(tname: str, data: bytes):
        if tname == "Variant":  # no standalone Variant class: wrap in a value-only DataValue
            return o6.decodeBinary(b"\x01" + data, o6.DataValue)
        cls = getattr(o6, tname, None) if tname in ("DataValue", "DiagnosticInfo", "ExpandedNodeId") else None
        return o6.decodeBinary(data, cls or getattr(dt, tname))

    def encode(tname: str, obj) -> bytes:
        out = o6.encodeBinary(obj)
        return out[1:] if tname == "Variant" else out

    failures = 0

    def report(ok: bool, name: str, what: str) -> None:
        nonlocal failures
        failures += not ok
        print(f"o6 {'ok' if ok else 'UNEXPECTED':10} {name}: {what}")

    for name, data in files.items():
        tname = O6_TYPES[name]
        if tname is None:  # full message: encoding NodeId prefix, then the body
            assert data[:4] == uab.nodeid_to_binary(encoding_id("ReadRequest"))
            tname, data = "ReadRequest", data[4:]
        try:
            obj = decode(tname, data)
            back = encode(tname, obj)
        except Exception as exc:  # noqa: BLE001 - any decode failure is a finding
            report(False, name, f"o6 cannot decode it: {exc!r}")
            continue
        if name == "quirk_datavalue_picoseconds_order.bin":
            report(obj.sourcePicoseconds != 1234, name,
                   f"o6 reads SourcePicoseconds={obj.sourcePicoseconds}, ServerTimestamp={obj.serverTimestamp} "
                   "(misplaced fields, as expected)")
        elif name == "quirk_diagnosticinfo_locale_only.bin":
            report(obj.locale is None and obj.localizedText == 3, name,
                   f"o6 reads Locale={obj.locale}, LocalizedText={obj.localizedText} (swapped, as expected)")
        elif name in O6_EXPECTED_REWRITES:
            old, new = O6_EXPECTED_REWRITES[name]
            report(data.count(old) == 1 and back == data.replace(old, new), name,
                   "round trip differs only by the expected rewrite")
        else:
            report(back == data, name, "round trip identical" if back == data else "round trip differs")
        if name == "datavalue_all_bits.bin":
            got = (int(obj.value), int(obj.status), obj.sourcePicoseconds, obj.serverPicoseconds,
                   str(obj.sourceTimestamp), str(obj.serverTimestamp))
            want = (7, SC_UNCERTAIN_INITIAL_VALUE, 1234, 5678, "2024-05-01T12:00:00Z", "2024-05-01T12:00:01.5Z")
            report(got == want, name, f"o6 decoded values {got}")
    return failures


# --------------------------------------------------------------------- main --
def generate() -> dict[str, bytes]:
    _sanity()
    return {name: make() for name, make in VECTORS.items()}


def write(out: Path, files: dict[str, bytes]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        (out / name).write_bytes(data)


def check(committed: Path) -> int:
    with tempfile.TemporaryDirectory(prefix="uascale-vectors-") as tmp:
        fresh = Path(tmp)
        write(fresh, generate())
        bad = []
        for name in VECTORS:
            want = committed / name
            if not want.is_file():
                bad.append(f"{name}: missing from {committed}")
            elif want.read_bytes() != (fresh / name).read_bytes():
                old, new = want.read_bytes(), (fresh / name).read_bytes()
                at = next((i for i, (a, b) in enumerate(zip(old, new)) if a != b), min(len(old), len(new)))
                bad.append(f"{name}: differs at byte {at} (committed {len(old)} bytes, generated {len(new)})")
        extra = sorted(p.name for p in committed.glob("*.bin") if p.name not in VECTORS)
        bad += [f"{name}: committed but no longer generated" for name in extra]
    for line in bad:
        print(f"gen_asyncua.py --check: {line}", file=sys.stderr)
    if not bad:
        print(f"gen_asyncua.py --check: {len(VECTORS)} vectors match {committed}")
    return 1 if bad else 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT, help="output directory (default: %(default)s)")
    ap.add_argument("--check", action="store_true", help="compare a fresh generation with --out; exit 1 on any difference")
    ap.add_argument("--crosscheck-o6", action="store_true", help="also round-trip every vector through o6 (open62541)")
    args = ap.parse_args(argv)

    found = importlib.metadata.version("asyncua")
    if found != REQUIRED_ASYNCUA:
        print(f"warning: asyncua {found} found, the vectors were made with {REQUIRED_ASYNCUA}", file=sys.stderr)

    if args.check:
        rc = check(args.out)
    else:
        files = generate()
        write(args.out, files)
        for name, data in files.items():
            print(f"wrote {args.out / name} ({len(data)} bytes)")
        rc = 0
    if args.crosscheck_o6:
        rc |= 1 if crosscheck_o6({n: (args.out / n).read_bytes() for n in VECTORS}) else 0
    return rc


if __name__ == "__main__":
    sys.exit(main())
