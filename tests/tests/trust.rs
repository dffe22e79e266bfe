//! Which firmware a NIC boots is the NIC's configuration (its trusted-keys
//! directory), never where the image lies: an image signed by a stranger's
//! key boots only if that key is configured, however close to the image the
//! key sits, and a genuine image boots wherever it is copied.

use std::path::{Path, PathBuf};
use std::process::Output;

use emp_tests::harness::{emp, image, root};

struct Scratch(PathBuf);

impl Scratch {
    fn new(tag: &str) -> Scratch {
        let d = std::env::temp_dir().join(format!("emp-trust-{}-{tag}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        Scratch(d)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = emp().args(["cluster", "down", "--dir"]).arg(self.0.join("cluster")).output();
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn up(s: &Scratch, firmware: &Path, trusted: Option<&Path>) -> Output {
    let mut c = emp();
    c.env_remove("EMP_TRUSTED_KEYS").args(["cluster", "up", "-n", "1", "--dir"]).arg(s.0.join("cluster"));
    c.arg("--firmware").arg(firmware);
    if let Some(t) = trusted {
        c.arg("--trusted-keys").arg(t);
    }
    let out = c.output().expect("emp");
    let _ = emp().args(["cluster", "down", "--dir"]).arg(s.0.join("cluster")).output();
    out
}

fn text(o: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

#[test]
fn a_key_beside_the_image_is_not_trusted() {
    let s = Scratch::new("stranger");
    let ok = emp().args(["fw", "keygen", "--name", "stranger", "--out"]).arg(&s.0).output().unwrap();
    assert!(ok.status.success(), "keygen: {}", text(&ok));
    let fw = s.0.join("fw.bin");
    let ok =
        emp().args(["fw", "sign", "--key"]).arg(s.0.join("stranger.key")).arg(image()).arg("--out").arg(&fw).output();
    let ok = ok.unwrap();
    assert!(ok.status.success(), "sign: {}", text(&ok));

    let refused = up(&s, &fw, None);
    assert!(!refused.status.success(), "a stranger's image booted because its key lay beside it: {}", text(&refused));
    assert!(text(&refused).contains("did not boot"), "{}", text(&refused));

    // Configured explicitly, the same key is trusted.
    let trusted = up(&s, &fw, Some(&s.0));
    assert!(trusted.status.success(), "explicitly trusted key refused: {}", text(&trusted));
}

#[test]
fn a_genuine_image_boots_wherever_it_is_copied() {
    let s = Scratch::new("copy");
    let fw = s.0.join("copied-fw.bin");
    std::fs::copy(image(), &fw).unwrap();
    let o = up(&s, &fw, None);
    assert!(o.status.success(), "a genuine image copied away from its keys was refused: {}", text(&o));
    // And the build tree's keys are what made it boot: an empty trusted
    // directory refuses it.
    let empty = s.0.join("no-keys");
    std::fs::create_dir_all(&empty).unwrap();
    let o = up(&s, &fw, Some(&empty));
    assert!(!o.status.success(), "booted with no trusted key: {}", text(&o));
    assert!(root().join("firmware-blobs").is_dir());
}
