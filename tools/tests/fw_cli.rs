//! `emp fw`: keygen, pack, sign, inspect, run as the real binary.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn emp(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_emp")).args(args).output().expect("run emp")
}

fn text(o: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

#[track_caller]
fn ok(args: &[&str]) -> String {
    let o = emp(args);
    assert!(o.status.success(), "emp {args:?} failed:\n{}", text(&o));
    text(&o)
}

#[track_caller]
fn fails(args: &[&str]) -> String {
    let o = emp(args);
    assert_eq!(o.status.code(), Some(1), "emp {args:?} should fail:\n{}", text(&o));
    let err = String::from_utf8_lossy(&o.stderr).to_string();
    assert!(err.starts_with("emp: "), "{err}");
    err
}

fn tmpdir(name: &str) -> PathBuf {
    let d = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("fw-cli-{name}-{}", std::process::id()));
    let _ = fs::remove_dir_all(&d);
    fs::create_dir_all(&d).unwrap();
    d
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// A small ELF file to use as the payload.
fn elf_payload(dir: &Path) -> PathBuf {
    let src = ["/bin/true", "/usr/bin/true"].iter().map(Path::new).find(|p| p.exists()).expect("/bin/true");
    let dst = dir.join("payload.so");
    fs::copy(src, &dst).unwrap();
    dst
}

#[test]
fn keygen_pack_sign_inspect() {
    let d = tmpdir("flow");
    let keys = d.join("keys");
    let payload = elf_payload(&d);
    let img = d.join("fw.bin");

    ok(&["fw", "keygen", "--out", s(&keys), "--name", "dev"]);
    let key = fs::read(keys.join("dev.key")).unwrap();
    assert_eq!(key.len(), 32);
    assert_eq!(fs::metadata(keys.join("dev.key")).unwrap().permissions().mode() & 0o777, 0o600);
    let public = fs::read_to_string(keys.join("dev.pub")).unwrap();
    assert_eq!(public.len(), 65);
    assert!(public.ends_with('\n') && public[..64].chars().all(|c| c.is_ascii_hexdigit()));

    ok(&["fw", "pack", "--payload", s(&payload), "--out", s(&img), "--build-id", "abc1234", "--cpu-plan", "dsr"]);
    let unsigned = ok(&["fw", "inspect", s(&img)]);
    assert!(unsigned.contains("signed:         no"), "{unsigned}");
    // Unsigned images are well formed but don't verify.
    let e = fails(&["fw", "inspect", s(&img), "--trusted", s(&keys)]);
    assert!(e.contains("signature"), "{e}");

    ok(&["fw", "sign", "--key", s(&keys.join("dev.key")), s(&img)]);
    let out = ok(&["fw", "inspect", s(&img), "--trusted", s(&keys)]);
    for want in [
        "magic:          ok",
        "abc1234",
        "cpu plan:       dsr",
        "matches payload",
        "signed:         yes",
        "verify:         ok",
    ] {
        assert!(out.contains(want), "missing {want:?} in:\n{out}");
    }
    let payload_len = fs::metadata(&payload).unwrap().len();
    assert!(out.contains(&format!("payload length: {payload_len}")), "{out}");
    assert_eq!(fs::metadata(&img).unwrap().len(), 256 + payload_len);

    // Re-signing with another key replaces the signature.
    let other = d.join("other");
    ok(&["fw", "keygen", "--out", s(&other)]);
    let resigned = d.join("resigned.bin");
    ok(&["fw", "sign", "--key", s(&other.join("dev.key")), s(&img), "--out", s(&resigned)]);
    ok(&["fw", "inspect", s(&resigned), "--trusted", s(&other)]);
    let e = fails(&["fw", "inspect", s(&resigned), "--trusted", s(&keys)]);
    assert!(e.contains("signature missing or untrusted"), "{e}");

    // A tampered payload byte: digest mismatch.
    let mut bytes = fs::read(&img).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0xff;
    let tampered = d.join("tampered.bin");
    fs::write(&tampered, &bytes).unwrap();
    let e = fails(&["fw", "inspect", s(&tampered), "--trusted", s(&keys)]);
    assert!(e.contains("digest mismatch") && e.contains("tampered.bin"), "{e}");
    let e = fails(&["fw", "inspect", s(&tampered)]);
    assert!(e.contains("digest mismatch"), "{e}");
    // Refuses to sign it.
    let e = fails(&["fw", "sign", "--key", s(&keys.join("dev.key")), s(&tampered)]);
    assert!(e.contains("digest mismatch"), "{e}");

    // A tampered signed header byte (build id): bad signature.
    let mut bytes = fs::read(&img).unwrap();
    bytes[20] ^= 1;
    fs::write(&tampered, &bytes).unwrap();
    let e = fails(&["fw", "inspect", s(&tampered), "--trusted", s(&keys)]);
    assert!(e.contains("signature"), "{e}");

    // Truncated: bad header.
    fs::write(&tampered, &fs::read(&img).unwrap()[..100]).unwrap();
    let e = fails(&["fw", "inspect", s(&tampered)]);
    assert!(e.contains("bad firmware image header"), "{e}");
}

#[test]
fn wrong_abi_is_refused() {
    let d = tmpdir("abi");
    let payload = elf_payload(&d);
    let img = d.join("fw.bin");
    ok(&["fw", "keygen", "--out", s(&d)]);
    ok(&["fw", "pack", "--payload", s(&payload), "--out", s(&img), "--abi", "999"]);
    ok(&["fw", "sign", "--key", s(&d.join("dev.key")), s(&img)]);
    let e = fails(&["fw", "inspect", s(&img), "--trusted", s(&d)]);
    assert!(e.contains("another ABI"), "{e}");
}

#[test]
fn keygen_refuses_overwrite_and_if_missing_is_noop() {
    let d = tmpdir("keygen");
    ok(&["fw", "keygen", "--out", s(&d), "--name", "k"]);
    let key = fs::read(d.join("k.key")).unwrap();
    let public = fs::read(d.join("k.pub")).unwrap();

    let e = fails(&["fw", "keygen", "--out", s(&d), "--name", "k"]);
    assert!(e.contains("k.key") && e.contains("--force"), "{e}");
    for _ in 0..2 {
        ok(&["fw", "keygen", "--out", s(&d), "--name", "k", "--if-missing"]);
    }
    assert_eq!(fs::read(d.join("k.key")).unwrap(), key);
    assert_eq!(fs::read(d.join("k.pub")).unwrap(), public);

    ok(&["fw", "keygen", "--out", s(&d), "--name", "k", "--force"]);
    assert_ne!(fs::read(d.join("k.key")).unwrap(), key);
    assert_eq!(fs::metadata(d.join("k.key")).unwrap().permissions().mode() & 0o777, 0o600);

    // Half a pair is not silently completed.
    fs::remove_file(d.join("k.pub")).unwrap();
    fails(&["fw", "keygen", "--out", s(&d), "--name", "k", "--if-missing"]);
    // Only the two key files are there (no temporary leftovers).
    let mut names: Vec<_> = fs::read_dir(&d).unwrap().map(|e| e.unwrap().file_name()).collect();
    names.sort();
    assert_eq!(names, ["k.key"]);
}

#[test]
fn pack_refuses_bad_payloads() {
    let d = tmpdir("pack");
    let out = d.join("fw.bin");
    let script = d.join("script.sh");
    fs::write(&script, "#!/bin/sh\n").unwrap();
    let e = fails(&["fw", "pack", "--payload", s(&script), "--out", s(&out)]);
    assert!(e.contains("not an ELF") && e.contains("script.sh"), "{e}");
    let e = fails(&["fw", "pack", "--payload", s(&d.join("missing.so")), "--out", s(&out)]);
    assert!(e.contains("missing.so"), "{e}");
    let big = d.join("big.so");
    let f = fs::File::create(&big).unwrap();
    f.set_len((64 << 20) + 1).unwrap(); // sparse
    let e = fails(&["fw", "pack", "--payload", s(&big), "--out", s(&out)]);
    assert!(e.contains("larger than"), "{e}");
    let payload = elf_payload(&d);
    let e = fails(&["fw", "pack", "--payload", s(&payload), "--out", s(&out), "--build-id", &"x".repeat(21)]);
    assert!(e.contains("build id"), "{e}");
    assert!(!out.exists());
    // Bad key / image files name themselves.
    ok(&["fw", "pack", "--payload", s(&payload), "--out", s(&out)]);
    let e = fails(&["fw", "sign", "--key", s(&script), s(&out)]);
    assert!(e.contains("script.sh"), "{e}");
    let e = fails(&["fw", "inspect", s(&out), "--trusted", s(&d)]);
    assert!(e.contains("no trusted keys"), "{e}");
}
