//! `emp bench … --json` on a private chassis: stdout is one JSON document
//! and nothing else (it pipes into `jq`); human lines go to stderr. Needs
//! the release binaries and the signed image (`make build`).

use emp_tests::harness::{emp, Cluster};

#[test]
fn bench_latency_json_is_the_only_thing_on_stdout() {
    let out =
        emp().args(["bench", "latency", "--json", "--sizes", "1,8", "--iters", "10"]).output().expect("run emp bench");
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "emp bench failed:\n{stdout}{stderr}");
    assert!(stderr.contains("cluster up:"), "the chassis line goes to stderr:\n{stderr}");
    let doc = stdout.trim();
    assert!(doc.starts_with('{'), "stdout must be JSON only:\n{stdout}");
    if let Err(at) = json::validate(doc) {
        panic!("stdout is not one JSON document (error at byte {at}):\n{stdout}");
    }
    for key in ["\"benchmark\":\"Latency\"", "\"unit\":\"us\"", "{\"size\":1,\"emp\":", "{\"size\":8,\"emp\":"] {
        assert!(doc.contains(key), "missing {key} in {doc}");
    }
}

/// `emp bench rate`: two pairs, every row carries the rate and the NIC's
/// CPU per message read from the chassis' daemons (a real, positive figure:
/// the engine did the work), and the ACK frames per message.
#[test]
fn bench_rate_json_has_the_nic_cpu_per_message() {
    let out = emp()
        .args(["bench", "rate", "--json", "--pairs", "2", "--sizes", "8,64", "--iters", "20"])
        .output()
        .expect("run emp bench");
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "emp bench rate failed:\n{stdout}{stderr}");
    let doc = stdout.trim();
    if let Err(at) = json::validate(doc) {
        panic!("stdout is not one JSON document (error at byte {at}):\n{stdout}");
    }
    for key in ["\"benchmark\":\"Rate\"", "\"pairs\":2", "{\"size\":8,\"messages\":2560,", "{\"size\":64,"] {
        assert!(doc.contains(key), "missing {key} in {doc}");
    }
    for field in ["\"nic_us_per_msg\":", "\"tcp_us_per_msg\":"] {
        let at = doc.find(field).unwrap_or_else(|| panic!("no {field} in {doc}")) + field.len();
        let num: String = doc[at..].chars().take_while(|c| c.is_ascii_digit() || *c == '.').collect();
        let v: f64 = num.parse().unwrap_or_else(|_| panic!("{field} is not a number in {doc}"));
        assert!(v > 0.0, "{field} {v} in {doc}");
    }
    // Coalesced cumulative ACKs: one ACK frame per message would be >= 1.0
    // (handshakes included); streaming windows of 64 cost far fewer.
    let field = "\"acks_per_msg\":";
    let at = doc.find(field).unwrap_or_else(|| panic!("no {field} in {doc}")) + field.len();
    let num: String = doc[at..].chars().take_while(|c| c.is_ascii_digit() || *c == '.').collect();
    let acks: f64 = num.parse().unwrap_or_else(|_| panic!("{field} is not a number in {doc}"));
    assert!(acks > 0.0 && acks < 0.75, "{acks} ACK frames per message in {doc}");
    // The same windows as persistent descriptors: each message a start.
    let out = emp()
        .args(["bench", "rate", "--json", "--persistent", "--sizes", "8,4096", "--iters", "10", "--no-tcp"])
        .output()
        .expect("run emp bench");
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "emp bench rate --persistent failed:\n{stdout}{stderr}");
    for key in ["\"descriptors\":\"persistent\"", "{\"size\":4096,\"messages\":640,"] {
        assert!(stdout.contains(key), "missing {key} in {stdout}");
    }
    let bad = emp().args(["bench", "rate", "--window", "0"]).output().expect("run emp bench");
    assert!(!bad.status.success(), "--window 0 accepted");
    let misplaced = emp().args(["bench", "bw", "--pairs", "2"]).output().expect("run emp bench");
    assert!(String::from_utf8_lossy(&misplaced.stderr).contains("options of `emp bench rate`"));
}

/// `emp bench ctxsw`: PM's Table 2 on the chassis. Every switch is
/// checked by the benchmark itself (held messages received, queued sends
/// delivered); here, every condition has its row, the images grow with
/// what the buffers held, and the times are real.
#[test]
fn bench_ctxsw_json_has_table_2() {
    let out = emp().args(["bench", "ctxsw", "--json", "--iters", "3"]).output().expect("run emp bench");
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(
        out.status.success(),
        "emp bench ctxsw failed:
{stdout}{stderr}"
    );
    let doc = stdout.trim();
    if let Err(at) = json::validate(doc) {
        panic!(
            "stdout is not one JSON document (error at byte {at}):
{stdout}"
        );
    }
    let field = |row: &str, name: &str| -> f64 {
        let r = doc.find(row).unwrap_or_else(|| panic!("no {row} in {doc}"));
        let key = format!("\"{name}\":");
        let at = r + doc[r..].find(&key).unwrap_or_else(|| panic!("no {name} in {doc}")) + key.len();
        let num: String = doc[at..].chars().take_while(|c| c.is_ascii_digit() || *c == '.').collect();
        num.parse().unwrap_or_else(|_| panic!("{name} of {row} is not a number in {doc}"))
    };
    let rows = ["no message", "send buffer full", "receive buffer full", "send and receive full"];
    let image: Vec<f64> = rows.iter().map(|r| field(r, "image_bytes")).collect();
    assert!(image[1] > image[0] && image[2] > image[0] && image[3] > image[1].max(image[2]), "images {image:?}");
    for r in rows {
        assert!(field(r, "save_us") > 0.0 && field(r, "restore_us") > 0.0, "{r} in {doc}");
    }
    assert_eq!(field("send buffer full", "sends"), 63.0);
    assert_eq!(field("receive buffer full", "recvs"), 64.0);
}

/// emp-nicd's `--link-delay-us` takes effect: every frame leaves that long
/// after it was sent, so a ping-pong's one-way latency (round trip / 2) is
/// never below the delay. A lower bound: no load on the machine can make
/// it flaky (load only adds).
#[test]
fn link_delay_bounds_ping_pong_latency_from_below() {
    let delay_us = 2000.0;
    let base = 31000 + (std::process::id() % 500) as u16 * 8;
    let c = Cluster::up(
        "linkdelay",
        &["-n", "2", "--wire", "udp", "--udp-base", &base.to_string(), "--nicd-args", "--link-delay-us 2000"],
    );
    let out = emp()
        .args(["bench", "latency", "--json", "--no-tcp", "--sizes", "8", "--iters", "20", "--dir"])
        .arg(c.path())
        .output()
        .expect("run emp bench");
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "emp bench failed:\n{stdout}{stderr}");
    let at = stdout.find("\"emp\":").unwrap_or_else(|| panic!("no EMP figure in {stdout}")) + 6;
    let num: String = stdout[at..].chars().take_while(|c| c.is_ascii_digit() || *c == '.').collect();
    let one_way: f64 = num.parse().unwrap_or_else(|_| panic!("bad number {num:?} in {stdout}"));
    assert!(one_way >= delay_us, "one-way latency {one_way} µs is below the {delay_us} µs link delay: {stdout}");
}

/// `emp bench bcast|bcast-tput|bcast-skew --algo nic-rb`: the reliable
/// broadcast's schemes (seed 002) run beside the host binomial and the NIC
/// tree on 4 ranks, 1 B (one multicast) and 2 KiB (two fragments through
/// the window); every record is a positive time. No timing asserts.
#[test]
fn bench_bcast_runs_the_reliable_broadcast_schemes() {
    let schemes = ["rb-window", "rb-coroot(1)", "rb-ack10", "rb-nak", "rb-hybrid10"];
    for kind in [&["bcast", "--turns"][..], &["bcast-tput"], &["bcast-skew", "--skew-us", "50"]] {
        let out = emp()
            .args(["bench"])
            .args(kind)
            .args(["--nodes", "4", "--algo", "nic,nic-rb", "--sizes", "1,2048", "--iters", "20", "--json"])
            .output()
            .expect("run emp bench");
        let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert!(out.status.success(), "emp bench {kind:?} failed:\n{stdout}{stderr}");
        let doc = stdout.trim();
        if let Err(at) = json::validate(doc) {
            panic!("stdout is not one JSON document (error at byte {at}):\n{stdout}");
        }
        let records = doc.matches("\"variant\":").count();
        // host-binomial, nic and the five schemes, at 2 sizes.
        assert_eq!(records, 2 * (2 + schemes.len()), "{kind:?}: {doc}");
        for v in schemes.iter().chain(&["host-binomial", "nic"]) {
            for size in [1, 2048] {
                let key = format!("{{\"variant\":\"{v}\",\"size\":{size},");
                let at = doc.find(&key).unwrap_or_else(|| panic!("{kind:?}: no {key} in {doc}"));
                let field = "\"value\":";
                let at = at + doc[at..].find(field).expect("value") + field.len();
                let num: String = doc[at..].chars().take_while(|c| c.is_ascii_digit() || *c == '.').collect();
                let value: f64 = num.parse().unwrap_or_else(|_| panic!("{kind:?} {v}: bad value in {doc}"));
                assert!(value > 0.0, "{kind:?} {v} size {size}: {value} in {doc}");
            }
        }
    }
    let refused = emp().args(["bench", "allreduce", "--algo", "nic-rb"]).output().expect("run emp bench");
    assert!(!refused.status.success());
    assert!(String::from_utf8_lossy(&refused.stderr).contains("does not run allreduce"));
}

#[test]
fn the_json_check_refuses_what_is_not_json() {
    assert_eq!(json::validate(r#"{"a":[1,-2.5e3,true,null,"x\"y"],"b":{}}"#), Ok(()));
    for bad in ["cluster up: 2 NICs\n{}", "{} {}", "{\"a\":inf}", "[1,]", "{\"a\" 1}", "\"open"] {
        assert!(json::validate(bad).is_err(), "{bad:?} accepted");
    }
}

/// A strict JSON validator (RFC 8259 grammar; the crate takes no serde).
mod json {
    /// `Ok` when `s` is exactly one JSON value (whitespace around allowed);
    /// else the byte offset where it stops being JSON.
    pub fn validate(s: &str) -> Result<(), usize> {
        let b = s.as_bytes();
        let mut at = skip_ws(b, 0);
        at = value(b, at)?;
        at = skip_ws(b, at);
        if at == b.len() {
            Ok(())
        } else {
            Err(at)
        }
    }

    fn skip_ws(b: &[u8], mut at: usize) -> usize {
        while at < b.len() && matches!(b[at], b' ' | b'\t' | b'\n' | b'\r') {
            at += 1;
        }
        at
    }

    fn value(b: &[u8], at: usize) -> Result<usize, usize> {
        match b.get(at) {
            Some(b'{') => seq(b, at + 1, b'}', |b, at| {
                let at = string(b, at)?;
                let at = skip_ws(b, at);
                if b.get(at) != Some(&b':') {
                    return Err(at);
                }
                value(b, skip_ws(b, at + 1))
            }),
            Some(b'[') => seq(b, at + 1, b']', value),
            Some(b'"') => string(b, at),
            Some(b't') => literal(b, at, "true"),
            Some(b'f') => literal(b, at, "false"),
            Some(b'n') => literal(b, at, "null"),
            _ => number(b, at),
        }
    }

    /// Comma-separated `item`s up to `close`.
    fn seq(
        b: &[u8],
        at: usize,
        close: u8,
        item: impl Fn(&[u8], usize) -> Result<usize, usize>,
    ) -> Result<usize, usize> {
        let mut at = skip_ws(b, at);
        if b.get(at) == Some(&close) {
            return Ok(at + 1);
        }
        loop {
            at = skip_ws(b, item(b, at)?);
            match b.get(at) {
                Some(&c) if c == close => return Ok(at + 1),
                Some(b',') => at = skip_ws(b, at + 1),
                _ => return Err(at),
            }
        }
    }

    fn string(b: &[u8], at: usize) -> Result<usize, usize> {
        if b.get(at) != Some(&b'"') {
            return Err(at);
        }
        let mut at = at + 1;
        loop {
            match b.get(at) {
                Some(b'"') => return Ok(at + 1),
                Some(b'\\') => match b.get(at + 1) {
                    Some(b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't') => at += 2,
                    Some(b'u') if b.get(at + 2..at + 6).is_some_and(|h| h.iter().all(u8::is_ascii_hexdigit)) => at += 6,
                    _ => return Err(at),
                },
                Some(&c) if c >= 0x20 => at += 1,
                _ => return Err(at),
            }
        }
    }

    fn literal(b: &[u8], at: usize, word: &str) -> Result<usize, usize> {
        if b[at..].starts_with(word.as_bytes()) {
            Ok(at + word.len())
        } else {
            Err(at)
        }
    }

    /// `-? int frac? exp?`.
    fn number(b: &[u8], at: usize) -> Result<usize, usize> {
        let digits = |mut at: usize| {
            let start = at;
            while b.get(at).is_some_and(u8::is_ascii_digit) {
                at += 1;
            }
            if at == start {
                Err(at)
            } else {
                Ok(at)
            }
        };
        let mut at = if b.get(at) == Some(&b'-') { at + 1 } else { at };
        at = if b.get(at) == Some(&b'0') { at + 1 } else { digits(at)? };
        if b.get(at) == Some(&b'.') {
            at = digits(at + 1)?;
        }
        if matches!(b.get(at), Some(b'e' | b'E')) {
            at += 1;
            if matches!(b.get(at), Some(b'+' | b'-')) {
                at += 1;
            }
            at = digits(at)?;
        }
        Ok(at)
    }
}
