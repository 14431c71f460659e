//! `potluck decode-packet` through the real binary.

use std::process::Command;

fn run(hex: &str) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_potluck"))
        .args(["decode-packet", hex])
        .output()
        .expect("potluck runs")
}

#[test]
fn decodes_a_vector_packet() {
    // error{problem:"hello"} from shared/vectors/packets_and_encodings.json.
    let out = run("c202070a0568656c6c6f");
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.starts_with("error (40)"), "{text}");
    assert!(text.contains("\"hello\""), "{text}");
}

#[test]
fn refuses_an_unknown_even_field_and_names_it() {
    // The same packet with field 2 (even, unknown) inside `error`.
    let out = run("c202090a0568656c6c6f1001");
    assert!(!out.status.success());
    let text = String::from_utf8_lossy(&out.stderr);
    assert!(text.contains("unknown even field 2 in error"), "{text}");
}

#[test]
fn refuses_bad_hex() {
    let out = run("zz");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("not valid hex"));
}
