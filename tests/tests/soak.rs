//! `emp soak` on a private chassis: a short soak with frame loss, kills and
//! collective rounds passes and reports its figures as JSON; and the soak
//! catches what it exists to catch: a corrupted payload, a receive
//! completion that never reaches the application, a send completion that
//! never comes (each injected by a hidden `--inject`), each making it fail.
//! The soaks run one at a time (each is 8 ranks on this machine's cores).
//! Needs the release binaries and the signed image (`make build`).

use std::process::Output;
use std::sync::Mutex;

use emp_tests::harness::emp;

static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

fn soak(args: &[&str]) -> Output {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    emp().arg("soak").args(args).output().expect("run emp soak")
}

/// The number after `"key":` in a JSON document.
fn field(doc: &str, key: &str) -> u64 {
    let at = doc.find(&format!("\"{key}\":")).unwrap_or_else(|| panic!("no {key} in {doc}")) + key.len() + 3;
    doc[at..].chars().take_while(|c| c.is_ascii_digit()).collect::<String>().parse().expect("a number")
}

#[test]
fn a_short_soak_with_loss_kills_and_collectives_passes() {
    // Seed 5: the first kill falls within the 15 s.
    let out = soak(&["--minutes", "0.25", "--seed", "5", "--kill-interval", "3", "--coll-interval", "2", "--json"]);
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "the soak failed:\n{stdout}\n{stderr}");
    let doc = stdout.trim();
    assert!(doc.starts_with('{') && doc.ends_with('}') && doc.lines().count() == 1, "stdout is the JSON only:\n{doc}");
    assert!(doc.contains("\"ok\":true") && doc.contains("\"errors_unexpected\":{}"), "{doc}");
    for key in ["sends", "recvs", "writes", "reads", "atomics", "colls", "kills", "restarts", "retransmits"] {
        assert!(field(doc, key) > 0, "{key} is 0 in {doc}");
    }
    assert_eq!(field(doc, "kills"), field(doc, "restarts"), "{doc}");
}

fn assert_caught(inject: &str, kind: &str, what: &str) {
    let out =
        soak(&["--minutes", "0.1", "--seed", "7", "--kill-interval", "0", "--op-deadline", "5", "--inject", inject]);
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(!out.status.success(), "the soak missed an injected {inject}:\n{stdout}\n{stderr}");
    assert!(stderr.contains(what), "no {what:?} for an injected {inject}:\n{stderr}");
    assert!(stdout.contains(&format!("errors unexpected: {kind}")), "{stdout}");
}

#[test]
fn a_corrupted_payload_fails_the_soak() {
    assert_caught("corrupt", "verify", "differs from what rank 1/0 sent");
}

#[test]
fn a_lost_receive_completion_fails_the_soak() {
    assert_caught("lose-recv", "verify", "of the");
}

#[test]
fn a_lost_send_completion_fails_the_soak() {
    assert_caught("lose-send", "hang", "outstanding over 5s");
}
