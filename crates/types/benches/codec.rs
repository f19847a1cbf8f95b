//! Encode and decode of ReadRequest / ReadResponse with 1 and 100 values.
//!
//! `cargo bench -p uascale-types --features sample --bench codec`

use criterion::{black_box, criterion_main, Criterion};
use uascale_types::*;

fn read_request(n: usize) -> ReadRequest {
    ReadRequest {
        request_header: RequestHeader {
            authentication_token: NodeId::opaque(0, vec![7; 32]),
            timestamp: DateTime::from_ticks(133_590_384_000_000_000),
            request_handle: 42,
            timeout_hint: 10_000,
            ..Default::default()
        },
        max_age: 0.0,
        timestamps_to_return: TimestampsToReturn::Both,
        nodes_to_read: Some(
            (0..n)
                .map(|i| ReadValueId {
                    node_id: NodeId::string(2, format!("Demo.Dynamic.Scalar.Double{i}")),
                    attribute_id: AttributeId::Value as u32,
                    ..Default::default()
                })
                .collect(),
        ),
    }
}

fn read_response(n: usize) -> ReadResponse {
    let t = DateTime::from_ticks(133_590_384_000_000_000);
    ReadResponse {
        response_header: ResponseHeader {
            timestamp: t,
            request_handle: 42,
            ..Default::default()
        },
        results: Some(
            (0..n)
                .map(|i| DataValue {
                    value: Some(Variant::Double(i as f64 * 0.5)),
                    source_timestamp: Some(t),
                    server_timestamp: Some(t),
                    ..Default::default()
                })
                .collect(),
        ),
        diagnostic_infos: Some(vec![]),
    }
}

fn bench_msg<T: Structure>(c: &mut Criterion, name: &str, msg: &T) {
    let mut buf = Vec::with_capacity(16 << 10);
    c.bench_function(&format!("encode {name}"), |b| {
        b.iter(|| {
            buf.clear();
            encode_message(black_box(msg), &mut buf);
            black_box(buf.len())
        })
    });
    let mut bytes = Vec::new();
    encode_message(msg, &mut bytes);
    let limits = DecodeLimits::default();
    c.bench_function(&format!("decode {name}"), |b| {
        b.iter(|| {
            let mut r = Reader::new(black_box(&bytes), &limits).unwrap();
            black_box(decode_message(&mut r).unwrap())
        })
    });
}

fn codec(c: &mut Criterion) {
    bench_msg(c, "ReadRequest x1", &read_request(1));
    bench_msg(c, "ReadRequest x100", &read_request(100));
    bench_msg(c, "ReadResponse x1", &read_response(1));
    bench_msg(c, "ReadResponse x100", &read_response(100));
}

#[allow(missing_docs)]
mod group {
    criterion::criterion_group!(benches, super::codec);
}
use group::benches;
criterion_main!(benches);
