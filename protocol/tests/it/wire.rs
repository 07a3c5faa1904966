//! Round trips of every message variant, byte-exact golden vectors, and decode errors.
//!
//! Golden files live in `tests/golden/`: `<name>.hex` holds the encoded frame, `<name>.json` the
//! value a generic MessagePack decoder must read back (checked from Python by
//! `tests/python/test_golden.py`). Regenerate after an intended wire change with
//! `GROVE_BLESS=1 cargo test -p grove-protocol --test wire`.

use std::collections::BTreeSet;
use std::path::PathBuf;

use grove_protocol::examples::{self, REQUEST_VARIANTS, RESPONSE_VARIANTS};
use grove_protocol::*;
use serde::Serialize;

fn golden_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/golden")
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[test]
fn every_request_variant_round_trips() {
    let mut seen = BTreeSet::new();
    for (name, env) in examples::requests() {
        seen.insert(examples::request_variant(&env.msg));
        let bytes = encode(&env).unwrap();
        let back = decode_request(&bytes).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(back, env, "{name}");
    }
    assert_eq!(seen, REQUEST_VARIANTS.into_iter().collect::<BTreeSet<_>>());
}

#[test]
fn every_response_variant_round_trips() {
    let mut seen = BTreeSet::new();
    for (name, env) in examples::responses() {
        seen.insert(examples::response_variant(&env.msg));
        let bytes = encode(&env).unwrap();
        let back = decode_response(&bytes).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(back, env, "{name}");
    }
    assert_eq!(seen, RESPONSE_VARIANTS.into_iter().collect::<BTreeSet<_>>());
}

#[test]
fn every_error_code_round_trips_with_a_unique_number() {
    let mut numbers = BTreeSet::new();
    let mut last = 0;
    for &code in ErrorCode::ALL {
        assert!(numbers.insert(code.number()), "duplicate number for {code}");
        assert!(code.number() > last, "ALL is in numbering order: {code} after {last}");
        last = code.number();
        let env = Envelope::new(1, Response::Error(ErrorInfo::new(code, "x")));
        let back = decode_response(&encode(&env).unwrap()).unwrap();
        assert_eq!(back, env);
        // The wire name is the snake_case string the docs list.
        let json = serde_json::to_value(code).unwrap();
        assert_eq!(json, serde_json::Value::String(code.name().into()));
    }
}

/// A frame written by hand, byte by byte, from the MessagePack spec: the encoding is pinned.
#[test]
fn ping_frame_is_byte_exact() {
    let env = Envelope::new(7, Request::Ping(Ping { nonce: 42 }));
    let expected: &[u8] = &[
        0x82, // map of 2
        0xa2, b'i', b'd', 0x07, // "id": 7
        0xa3, b'm', b's', b'g', // "msg":
        0x81, // map of 1 (externally tagged variant)
        0xa4, b'P', b'i', b'n', b'g', 0x81, // "Ping": map of 1
        0xa5, b'n', b'o', b'n', b'c', b'e', 0x2a, // "nonce": 42
    ];
    assert_eq!(encode(&env).unwrap(), expected);
    assert_eq!(decode_request(expected).unwrap(), env);
    // A unit variant is a bare string.
    let stats = encode(&Envelope::new(1, Request::Stats)).unwrap();
    assert_eq!(stats, [0x82, 0xa2, b'i', b'd', 0x01, 0xa3, b'm', b's', b'g', 0xa5, b'S', b't', b'a', b't', b's']);
}

fn check_golden<M: Serialize>(name: &str, env: &Envelope<M>, bless: bool, stale: &mut Vec<String>) {
    let bytes = encode(env).unwrap();
    let json = serde_json::to_string_pretty(env).unwrap() + "\n";
    let hex_path = golden_dir().join(format!("{name}.hex"));
    let json_path = golden_dir().join(format!("{name}.json"));
    if bless {
        std::fs::write(&hex_path, hex(&bytes) + "\n").unwrap();
        std::fs::write(&json_path, &json).unwrap();
        return;
    }
    let on_disk = std::fs::read_to_string(&hex_path).unwrap_or_default();
    let json_on_disk = std::fs::read_to_string(&json_path).unwrap_or_default();
    if on_disk.trim() != hex(&bytes) || json_on_disk != json {
        stale.push(name.to_string());
    }
}

#[test]
fn golden_vectors_match_the_encoder() {
    let bless = std::env::var_os("GROVE_BLESS").is_some();
    let mut stale = Vec::new();
    let mut names = BTreeSet::new();
    for (name, env) in examples::requests() {
        check_golden(&format!("request_{name}"), &env, bless, &mut stale);
        names.insert(format!("request_{name}"));
    }
    for (name, env) in examples::responses() {
        check_golden(&format!("response_{name}"), &env, bless, &mut stale);
        names.insert(format!("response_{name}"));
    }
    assert!(
        stale.is_empty(),
        "golden vectors differ from the encoder (rerun with GROVE_BLESS=1 if intended): {stale:?}"
    );
    // No orphaned golden files either.
    let on_disk: BTreeSet<String> = std::fs::read_dir(golden_dir())
        .unwrap()
        .filter_map(|e| e.ok()?.path().file_stem()?.to_str().map(str::to_owned))
        .collect();
    assert_eq!(on_disk, names);
}

#[test]
fn garbage_is_a_decode_error_not_a_panic() {
    for bytes in [&b""[..], &[0xc1], &[0x82, 0xa2, b'i', b'd'], &[0xdd, 0xff, 0xff, 0xff, 0xff], b"{\"id\":1}"] {
        assert!(decode_request(bytes).is_err(), "{bytes:?}");
    }
}

#[test]
fn decode_error_keeps_the_request_id_when_readable() {
    // {"id": 5, "msg": {"Teleport": {}}}: the id is readable, the message is not.
    #[derive(Serialize)]
    struct Bogus {
        id: u64,
        msg: std::collections::BTreeMap<&'static str, std::collections::BTreeMap<&'static str, u8>>,
    }
    let bytes = rmp_serde::to_vec_named(&Bogus { id: 5, msg: [("Teleport", Default::default())].into() }).unwrap();
    let err = decode_request(&bytes).unwrap_err();
    assert_eq!(err.id, Some(5));
    assert!(err.to_string().contains("request 5"), "{err}");
    // Wrong field type: the id is still found.
    let bytes = rmp_serde::to_vec_named(&Envelope::new(9, ("not", "a", "request"))).unwrap();
    assert_eq!(decode_request(&bytes).unwrap_err().id, Some(9));
    // No id at all.
    assert_eq!(decode_request(&[0x90]).unwrap_err().id, None);
}
