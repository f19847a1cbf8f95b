"""Companion NodeSets loaded with `uascale serve --nodeset`, with Python
asyncua: the namespaces are in the NamespaceArray, the loaded nodes are
browsable, asyncua builds the structure types from their DataTypeDefinition
(load_data_type_definitions) and decodes the structure values the server
encoded from the XML, writes a structure (and a subtype of it) back, reads
a 2-D index range of a matrix, gets DisplayNames in the session's locale and
writes a DisplayName. (asyncua logs "Browsename collision" for namespace-0
types it already knows while loading the definitions; that is harmless.)

usage: companion_asyncua.py URL   (server started with devices.NodeSet2.xml
                                   and machines.NodeSet2.xml from tests/nodesets)
"""
import asyncio
import sys

from asyncua import Client, ua
from asyncua.common.ua_utils import get_node_supertypes
from common import check, expect_status

DEVICES = "http://uascale.example/Devices/"
MACHINES = "http://uascale.example/Machines/"


async def main(url):
    client = Client(url, timeout=10)
    client.set_locale(["de-AT", "en"])
    async with client:
        ns = await client.get_namespace_array()
        check(DEVICES in ns and MACHINES in ns, f"namespace array {ns}")
        dev = ns.index(DEVICES)
        mac = ns.index(MACHINES)
        check(mac > dev > 2, f"companion namespaces after the demo: {ns}")

        # Browse Objects -> Machine1 and its children.
        machine = await client.nodes.objects.get_child(f"{mac}:Machine1")
        check(machine.nodeid == ua.NodeId(7001, mac), f"Machine1 id {machine.nodeid}")
        children = {c.Name: c.NamespaceIndex for c in
                    [await n.read_browse_name() for n in await machine.get_children()]}
        for name, idx in [("SerialNumber", dev), ("Config", mac), ("State", dev),
                          ("Temperature", mac), ("Position", mac), ("Speeds", mac)]:
            check(children.get(name) == idx, f"child {name} in ns {idx}: {children}")
        type_def = await machine.read_type_definition()
        check(type_def == ua.NodeId(1001, mac), f"type definition {type_def}")
        serial = await machine.get_child(f"{dev}:SerialNumber")
        check(await serial.read_value() == "M-0001", "SerialNumber")
        # The HasSubtype chain MachineType -> DeviceType -> BaseObjectType.
        supers = await get_node_supertypes(client.get_node(ua.NodeId(1001, mac)), skipbase=False)
        check([n.nodeid for n in supers[:2]] == [ua.NodeId(1001, dev), ua.NodeId(58)],
              f"supertypes {supers}")

        # Locale selection: de-AT falls back to the "de" translation.
        name = await machine.read_display_name()
        check(name.Text == "Maschine 1" and name.Locale == "de", f"DisplayName {name}")
        refs = await client.nodes.objects.get_references(refs=ua.ObjectIds.Organizes)
        shown = [r.DisplayName.Text for r in refs if r.NodeId == machine.nodeid]
        check(shown == ["Maschine 1"], f"Browse DisplayName in de: {shown}")
        temp = client.get_node("ns=2;s=Demo.Static.Temperature")
        name = await temp.read_display_name()
        check(name.Text == "Temperatur", f"Temperature in de: {name}")

        # Structures: asyncua builds the types from DataTypeDefinition.
        await client.load_data_type_definitions()
        config = await machine.get_child(f"{mac}:Config")
        value = await config.read_value()
        check(type(value).__name__ == "MachineConfig", f"Config decoded: {value!r}")
        check(value.Name == "Press 1" and value.Speed == 12.5, f"Config fields {value}")
        check((value.Position.X, value.Position.Y, value.Position.Z) == (1.0, -2.5, 3.0),
              f"nested Vector3 {value.Position}")
        check(list(value.Setpoints) == [10.0, 20.0, 30.5], f"array field {value.Setpoints}")
        check(int(value.State) == 1, f"enum field {value.State}")
        check(value.Comment == "calibrated 2026-11", f"optional field {value.Comment}")
        position = await (await machine.get_child(f"{mac}:Position")).read_value()
        check((position.X, position.Y, position.Z) == (0.5, 0.25, 0.0), f"Position {position}")
        result = await (await machine.get_child(f"{mac}:LastResult")).read_value()
        check((result.Encoding, result.Value) == (2, "sensor offline"), f"union {result!r}")
        state = await (await machine.get_child(f"{dev}:State")).read_value()
        check(state == 1, f"enum variable reads as Int32: {state!r}")

        # Write the structure back, changed, and read it again.
        value.Name = "Press 1b"
        value.Setpoints = [1.0, 2.0]
        value.Comment = None
        await config.write_value(ua.DataValue(ua.Variant(value, ua.VariantType.ExtensionObject)))
        again = await config.read_value()
        check(again.Name == "Press 1b" and list(again.Setpoints) == [1.0, 2.0]
              and again.Comment is None, f"written back {again}")
        # A subtype of the variable's DataType is accepted...
        ext = ua.ExtendedMachineConfig()
        ext.Name, ext.Operator = "Press 2", "ada"
        ext.Position = ua.Vector3()
        await config.write_value(ua.DataValue(ua.Variant(ext, ua.VariantType.ExtensionObject)))
        got = await config.read_value()
        check(type(got).__name__ == "ExtendedMachineConfig" and got.Operator == "ada",
              f"subtype written {got!r}")
        # ...another structure is not.
        await expect_status(
            config.write_value(ua.DataValue(ua.Variant(ua.Vector3(), ua.VariantType.ExtensionObject))),
            ua.StatusCodes.BadTypeMismatch, "Vector3 into a MachineConfig")
        # Read-only per the file's AccessLevel.
        pos_node = await machine.get_child(f"{mac}:Position")
        await expect_status(
            pos_node.write_value(ua.DataValue(ua.Variant(ua.Vector3(), ua.VariantType.ExtensionObject))),
            ua.StatusCodes.BadNotWritable, "read-only Position")

        # A 2-D index range on the demo matrix (3 x 4, 0..11 row by row).
        params = ua.ReadParameters()
        rv = ua.ReadValueId()
        rv.NodeId = ua.NodeId.from_string("ns=2;s=Demo.Static.Matrix")
        rv.AttributeId = ua.AttributeIds.Value
        rv.IndexRange = "1:2,0:1"
        params.NodesToRead = [rv]
        res = await client.uaclient.read(params)
        got = res[0].Value
        check(got.Dimensions == [2, 2] and got.Value in ([[4, 5], [8, 9]], [4, 5, 8, 9]),
              f"matrix range {got}")
        rv.IndexRange = "3,0"
        res = await client.uaclient.read(params)
        check(res[0].StatusCode.value == ua.StatusCodes.BadIndexRangeNoData, f"{res[0]}")

        # DisplayName is writable where the WriteMask allows it.
        await machine.write_attribute(ua.AttributeIds.DisplayName,
                                      ua.DataValue(ua.Variant(ua.LocalizedText("Presse A", "de"))))
        name = await machine.read_display_name()
        check(name.Text == "Presse A", f"written DisplayName {name}")
        await expect_status(
            machine.write_attribute(ua.AttributeIds.BrowseName,
                                    ua.DataValue(ua.Variant(ua.QualifiedName("X", mac)))),
            ua.StatusCodes.BadNotWritable, "BrowseName not in the WriteMask")
        await expect_status(
            machine.write_attribute(ua.AttributeIds.Description,
                                    ua.DataValue(ua.Variant("plain string"))),
            ua.StatusCodes.BadTypeMismatch, "Description needs a LocalizedText")

    # Another session, another locale.
    client = Client(url, timeout=10)
    client.set_locale(["fr"])
    async with client:
        name = await client.get_node("ns=2;s=Demo.Static.Temperature").read_display_name()
        check(name.Text == "Température" and name.Locale == "fr", f"Temperature in fr: {name}")
    print("asyncua companion ok")


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
