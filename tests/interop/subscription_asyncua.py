"""Subscriptions against a uascale server with Python asyncua.

usage: subscription_asyncua.py URL
The server runs with --rate-ms 100 (the demo changes every 100 ms).

- Data change: a subscription at 100 ms on ns=2;s=Demo.Dynamic.Counter gets
  every value the counter takes (consecutive, no gaps, no repeats): 20
  changes are awaited (counted, not timed: a loaded machine only makes the
  wait longer, up to 30 s).
- Events: an EventFilter with a where clause (Severity > 500 and Message
  like 'Demo event %') on the Server object gets exactly the matching demo
  events: every one in the window, none that does not match.
- Republish: a message acknowledged late is returned again by Republish;
  one already acknowledged is BadMessageNotAvailable.
- TransferSubscriptions: a second session takes the first's subscription
  with sendInitialValues; the first gets a StatusChange
  GoodSubscriptionTransferred, the second the data.
- Audit (the server runs with auditing = true): Server.Auditing reads
  true; an event subscription on the Server object for
  AuditSessionEventType gets a second session's CreateSession,
  ActivateSession and CloseSession, in order, each with its type, its
  SourceName, Status true and that session's SessionId.
- Bad input: an unknown node, a bad subscription id, a Publish without
  subscriptions (BadNoSubscription).
"""
import asyncio
import sys

from asyncua import Client, ua
from common import check, expect_status

COUNTER = "ns=2;s=Demo.Dynamic.Counter"


class Changes:
    def __init__(self):
        self.values = []
        self.events = []
        self.status = []

    def datachange_notification(self, node, val, data):
        self.values.append(val)

    def event_notification(self, event):
        self.events.append(event)

    def status_change_notification(self, status):
        self.status.append(status)


async def data_change(client):
    h = Changes()
    sub = await client.create_subscription(100, h)
    # A queue of 10: a publishing cycle that, on a loaded machine, spans two
    # ticks keeps both values instead of the newest only.
    await sub.subscribe_data_change(client.get_node(COUNTER), queuesize=10)
    for _ in range(300):
        if len(h.values) >= 20:
            break
        await asyncio.sleep(0.1)
    await sub.delete()
    v = h.values
    check(len(v) >= 20, f"20 changes within 30 s, got {len(v)}: {v}")
    gaps = [(a, b) for a, b in zip(v, v[1:]) if b != a + 1]
    check(not gaps, f"every change delivered, in order: gaps {gaps} in {v}")


def severity_filter():
    def sel(name):
        op = ua.SimpleAttributeOperand()
        op.TypeDefinitionId = ua.NodeId(2041)
        op.BrowsePath = [ua.QualifiedName(name, 0)]
        op.AttributeId = ua.AttributeIds.Value
        return op

    f = ua.EventFilter()
    f.SelectClauses = [sel("Message"), sel("Severity"), sel("SourceName")]
    gt = ua.ContentFilterElement()
    gt.FilterOperator = ua.FilterOperator.GreaterThan
    gt.FilterOperands = [sel("Severity"), ua.LiteralOperand(Value=ua.Variant(500, ua.VariantType.UInt16))]
    like = ua.ContentFilterElement()
    like.FilterOperator = ua.FilterOperator.Like
    like.FilterOperands = [sel("Message"), ua.LiteralOperand(Value=ua.Variant("Demo event %"))]
    both = ua.ContentFilterElement()
    both.FilterOperator = ua.FilterOperator.And
    both.FilterOperands = [ua.ElementOperand(Index=1), ua.ElementOperand(Index=2)]
    f.WhereClause.Elements = [both, gt, like]
    return f


async def events(client):
    h = Changes()
    sub = await client.create_subscription(100, h)
    await sub.subscribe_events(client.nodes.server, evfilter=severity_filter())
    await asyncio.sleep(3.0)
    await sub.delete()
    got = [(int(e.Message.Text.split()[-1]), e.Severity) for e in h.events]
    check(len(got) >= 8, f"matching events in 3 s: {got}")
    check(all(s > 500 for _, s in got), f"only matching events: {got}")
    for n, s in got:
        check(s == (n % 10 + 1) * 100, f"event {n} has severity {s}")
    # Every matching event between the first and the last arrived.
    first, last = got[0][0], got[-1][0]
    expected = [n for n in range(first, last + 1) if (n % 10 + 1) * 100 > 500]
    check([n for n, _ in got] == expected, f"exactly the matching events: {got} vs {expected}")


async def audit(url, client):
    auditing = await client.get_node(ua.ObjectIds.Server_Auditing).read_value()
    check(auditing is True, f"Server.Auditing: {auditing}")
    h = Changes()
    sub = await client.create_subscription(100, h)
    await sub.subscribe_events(client.nodes.server, ua.ObjectIds.AuditSessionEventType)
    b = Client(url, timeout=10)
    await b.connect()
    await b.disconnect()
    for _ in range(30):
        if len(h.events) >= 3:
            break
        await asyncio.sleep(0.1)
    await asyncio.sleep(0.3)
    await sub.delete()
    got = [(e.SourceName, e.EventType, e.Status) for e in h.events]
    want = [
        ("Session/CreateSession", ua.NodeId(ua.ObjectIds.AuditCreateSessionEventType), True),
        ("Session/ActivateSession", ua.NodeId(ua.ObjectIds.AuditActivateSessionEventType), True),
        ("Session/CloseSession", ua.NodeId(ua.ObjectIds.AuditSessionEventType), True),
    ]
    check(got == want, f"audit events: {got}")
    sids = {str(e.SessionId) for e in h.events}
    check(len(sids) == 1 and not h.events[0].SessionId.is_null(), f"one session: {sids}")
    check(h.events[1].ClientUserId == "Anonymous", f"user: {h.events[1].ClientUserId}")


async def publish_raw(client, acks=()):
    return await client.uaclient.publish(list(acks))


async def republish(client):
    # A subscription driven by hand: Publish by Publish.
    params = ua.CreateSubscriptionParameters()
    params.RequestedPublishingInterval = 100
    params.RequestedLifetimeCount = 300
    params.RequestedMaxKeepAliveCount = 10
    params.PublishingEnabled = True
    req = ua.CreateSubscriptionRequest()
    req.Parameters = params
    data = await client.uaclient.protocol.send_request(req)
    res = ua.ua_binary.struct_from_binary(ua.CreateSubscriptionResponse, data)
    res.ResponseHeader.ServiceResult.check()
    sid = res.Parameters.SubscriptionId
    check(res.Parameters.RevisedPublishingInterval == 100, f"revised interval {res.Parameters}")
    check(res.Parameters.RevisedLifetimeCount == 300 and res.Parameters.RevisedMaxKeepAliveCount == 10, f"revised counts {res.Parameters}")
    item = ua.MonitoredItemCreateRequest()
    item.ItemToMonitor.NodeId = ua.NodeId.from_string(COUNTER)
    item.ItemToMonitor.AttributeId = ua.AttributeIds.Value
    item.MonitoringMode = ua.MonitoringMode.Reporting
    item.RequestedParameters.ClientHandle = 7
    item.RequestedParameters.SamplingInterval = 100
    item.RequestedParameters.QueueSize = 10
    cp = ua.CreateMonitoredItemsParameters()
    cp.SubscriptionId = sid
    cp.ItemsToCreate = [item]
    cp.TimestampsToReturn = ua.TimestampsToReturn.Both
    r = await client.uaclient.create_monitored_items(cp)
    check(r[0].StatusCode.is_good(), f"item created: {r[0].StatusCode}")
    p1 = await publish_raw(client)
    check(p1.Parameters.SubscriptionId == sid, "published for our subscription")
    seq = p1.Parameters.NotificationMessage.SequenceNumber
    check(len(p1.Parameters.NotificationMessage.NotificationData) == 1, "a data change")
    check(seq in p1.Parameters.AvailableSequenceNumbers, "retained for Republish")
    rq = ua.RepublishRequest()
    rq.Parameters.SubscriptionId = sid
    rq.Parameters.RetransmitSequenceNumber = seq
    data = await client.uaclient.protocol.send_request(rq)
    rr = ua.ua_binary.struct_from_binary(ua.RepublishResponse, data)
    rr.ResponseHeader.ServiceResult.check()
    check(rr.NotificationMessage == p1.Parameters.NotificationMessage, "Republish returns the same message")
    # Acknowledge it: it is gone.
    ack = ua.SubscriptionAcknowledgement(SubscriptionId=sid, SequenceNumber=seq)
    p2 = await publish_raw(client, [ack])
    check(p2.Parameters.Results == [ua.StatusCode(ua.StatusCodes.Good)], f"ack result {p2.Parameters.Results}")
    await expect_status(client.uaclient.protocol.send_request(rq), ua.StatusCodes.BadMessageNotAvailable, "Republish of an acknowledged message")
    # Unknown sequence numbers and subscriptions in acknowledgements.
    bad = [ua.SubscriptionAcknowledgement(SubscriptionId=sid, SequenceNumber=999999),
           ua.SubscriptionAcknowledgement(SubscriptionId=424242, SequenceNumber=1)]
    p3 = await publish_raw(client, bad)
    check([s.value for s in p3.Parameters.Results] == [ua.StatusCodes.BadSequenceNumberUnknown, ua.StatusCodes.BadSubscriptionIdInvalid], f"ack results {p3.Parameters.Results}")
    return sid


async def transfer(url, a, sid):
    b = Client(url, timeout=10)
    await b.connect()
    try:
        tp = ua.TransferSubscriptionsParameters()
        tp.SubscriptionIds = [sid, 424242]
        tp.SendInitialValues = True
        results = await b.uaclient.transfer_subscriptions(tp)
        check(results[0].StatusCode.is_good(), f"transfer: {results[0].StatusCode}")
        check(results[1].StatusCode.value == ua.StatusCodes.BadSubscriptionIdInvalid, f"unknown id: {results[1].StatusCode}")
        # The old session is told.
        pa = await publish_raw(a)
        data = pa.Parameters.NotificationMessage.NotificationData
        check(pa.Parameters.SubscriptionId == sid and len(data) == 1 and isinstance(data[0], ua.StatusChangeNotification), f"status change to the old session: {pa}")
        check(data[0].Status.value == 0x002D0000, f"GoodSubscriptionTransferred: {data[0].Status}")
        # The new session gets the data, starting with the initial value.
        pb = await publish_raw(b)
        check(pb.Parameters.SubscriptionId == sid, "the new session publishes it")
        dcs = pb.Parameters.NotificationMessage.NotificationData
        check(len(dcs) == 1 and dcs[0].MonitoredItems[0].ClientHandle == 7, f"data on the new session: {pb}")
        # The old one no longer has it.
        await expect_status(_delete_expect(a, sid), ua.StatusCodes.BadSubscriptionIdInvalid, "gone from the old session")
        r = await b.uaclient.delete_subscriptions([sid])
        check(r[0].is_good(), f"deleted by the new owner: {r}")
        # No subscription left on b: Publish is BadNoSubscription.
        await expect_status(publish_raw(b), ua.StatusCodes.BadNoSubscription, "publish without subscriptions")
    finally:
        await b.disconnect()


async def _delete_expect(client, sid):
    r = await client.uaclient.delete_subscriptions([sid])
    r[0].check()


async def bad_input(client):
    h = Changes()
    sub = await client.create_subscription(100, h)
    try:
        await sub.subscribe_data_change(client.get_node("ns=2;s=Nope"))
        check(False, "unknown node must fail")
    except ua.UaStatusCodeError as e:
        check(e.code == ua.StatusCodes.BadNodeIdUnknown, f"unknown node: {e}")
    await sub.delete()
    mp = ua.ModifySubscriptionParameters()
    mp.SubscriptionId = 999999
    await expect_status(client.uaclient.update_subscription(mp), ua.StatusCodes.BadSubscriptionIdInvalid, "modify unknown")


async def main(url):
    a = Client(url, timeout=10)
    await a.connect()
    try:
        await data_change(a)
        await events(a)
        await audit(url, a)
        await bad_input(a)
    finally:
        await a.disconnect()
    # Hand-driven publishing needs a session without asyncua's publish loop.
    a = Client(url, timeout=10)
    await a.connect()
    try:
        sid = await republish(a)
        await transfer(url, a, sid)
    finally:
        await a.disconnect()
    print("asyncua subscriptions ok")


asyncio.run(main(sys.argv[1]))
