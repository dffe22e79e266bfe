//! `make install DESTDIR=<tmp>`: the staged tree holds what docs/install.md
//! promises, with the right modes, a second run changes nothing, and a C
//! program finds the installed header and library through pkg-config. It
//! needs `make build` first (the release binaries, libemp.so.1, the signed
//! firmware image).

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use emp_tests::harness::{bin_dir, root};

/// A staging directory removed when the test ends, passed or not.
struct Stage(PathBuf);

impl Drop for Stage {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn make_install(dest: &Path) -> String {
    let out = Command::new("make")
        .arg("-C")
        .arg(root())
        .arg("install")
        .arg(format!("DESTDIR={}", dest.display()))
        .args(["PREFIX=/usr/local", "EMP_GROUP=emp"])
        .output()
        .expect("make");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "make install failed:\n{text}");
    text
}

/// Every file under `dir` (relative path, mode, size, modification time).
fn tree(dir: &Path) -> Vec<(PathBuf, u32, u64, Option<std::time::SystemTime>)> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).expect("read_dir").map(|e| e.expect("entry")) {
            let m = std::fs::symlink_metadata(e.path()).expect("metadata");
            if m.is_dir() {
                todo.push(e.path());
            }
            let rel = e.path().strip_prefix(dir).expect("under dir").to_path_buf();
            out.push((rel, m.permissions().mode(), m.len(), m.modified().ok()));
        }
    }
    out.sort();
    out
}

fn mode(p: &Path) -> u32 {
    std::fs::metadata(p).unwrap_or_else(|e| panic!("{}: {e}", p.display())).permissions().mode() & 0o7777
}

#[test]
fn make_install_stages_a_complete_tree_and_c_links_through_pkg_config() {
    let built = bin_dir();
    for f in ["emp", "emp-nicd", "lib/libemp.so.1"] {
        assert!(built.join(f).exists(), "{} missing: run `make build`", built.join(f).display());
    }
    let stage = Stage(std::env::temp_dir().join(format!("emp-install-{}", std::process::id())));
    let d = &stage.0;
    let _ = std::fs::remove_dir_all(d);
    make_install(d);

    let p = |rel: &str| d.join(rel.trim_start_matches('/'));
    for (f, want) in [
        ("/usr/local/bin/emp", 0o755),
        ("/usr/local/bin/emp-nicd", 0o755),
        ("/usr/local/lib/libemp.so.1", 0o755),
        ("/usr/local/include/emp.h", 0o644),
        ("/usr/local/lib/pkgconfig/emp.pc", 0o644),
        ("/lib/firmware/emp/emp-fw.bin", 0o644),
        ("/lib/udev/rules.d/60-emp.rules", 0o644),
    ] {
        assert_eq!(mode(&p(f)), want, "{f}: mode");
    }
    assert_eq!(std::fs::read_link(p("/usr/local/lib/libemp.so")).expect("libemp.so symlink"), Path::new("libemp.so.1"));
    let keys: Vec<_> = std::fs::read_dir(p("/lib/firmware/emp"))
        .expect("firmware dir")
        .filter_map(|e| e.ok())
        .filter(|e| e.path().extension().is_some_and(|x| x == "pub"))
        .collect();
    assert!(!keys.is_empty(), "no trusted public key installed beside the firmware image");
    assert_eq!(
        std::fs::read(p("/lib/firmware/emp/emp-fw.bin")).expect("image"),
        std::fs::read(root().join("firmware-blobs/emp-fw.bin")).expect("built image"),
        "the installed firmware image differs from the built one"
    );
    let rule = std::fs::read_to_string(p("/lib/udev/rules.d/60-emp.rules")).expect("rule");
    assert!(
        rule.lines().any(|l| !l.starts_with('#')
            && l.contains(r#"KERNEL=="emp-nic*""#)
            && l.contains(r#"GROUP="emp""#)
            && l.contains(r#"MODE="0660""#)),
        "the udev rule does not give /dev/emp-nic* to group emp, mode 0660:\n{rule}"
    );
    let ko = root().join("driver/emp.ko");
    if ko.exists() {
        let modules = p("/lib/modules");
        let found = std::fs::read_dir(&modules)
            .expect("modules dir")
            .filter_map(|e| e.ok())
            .any(|e| e.path().join("extra/emp.ko").exists());
        assert!(found, "driver/emp.ko is built but not installed under {}", modules.display());
    }

    // Idempotent: a second run leaves the same files with the same modes.
    let first: Vec<_> = tree(d).into_iter().map(|(p, m, s, _)| (p, m, s)).collect();
    make_install(d);
    let second: Vec<_> = tree(d).into_iter().map(|(p, m, s, _)| (p, m, s)).collect();
    assert_eq!(first, second, "a second make install changed the tree");

    // A C program builds with what pkg-config says, against the staged tree.
    let pc = |arg: &str| {
        let out = Command::new("pkg-config")
            .arg(arg)
            .arg("emp")
            .env("PKG_CONFIG_PATH", p("/usr/local/lib/pkgconfig"))
            .env("PKG_CONFIG_SYSROOT_DIR", d)
            .env_remove("PKG_CONFIG_LIBDIR")
            .output()
            .expect("pkg-config is required");
        assert!(out.status.success(), "pkg-config {arg} emp: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };
    let cflags = pc("--cflags");
    let libs = pc("--libs");
    assert!(cflags.contains(&format!("-I{}", p("/usr/local/include").display())), "cflags: {cflags}");
    assert!(libs.contains("-lemp"), "libs: {libs}");
    let src = d.join("use-emp.c");
    std::fs::write(
        &src,
        r#"#include <emp.h>
#include <stdio.h>
#include <string.h>

/* Opening a path that is no device fails cleanly through the installed library. */
int main(void)
{
	int err = 0;
	struct emp_device *dev = emp_open_device("/nonexistent/emp-nic", &err);

	if (dev != NULL || err == 0) {
		fprintf(stderr, "emp_open_device: dev %p err %d\n", (void *)dev, err);
		return 1;
	}
	printf("installed libemp: open refused (err %d), status 0 is \"%s\"\n", err, emp_wc_status_str(0));
	return strlen(emp_wc_status_str(0)) > 0 ? 0 : 1;
}
"#,
    )
    .expect("write C source");
    let exe = d.join("use-emp");
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let st = Command::new(&cc)
        .args(["-Wall", "-Wextra", "-Werror"])
        .arg(&src)
        .args(cflags.split_whitespace())
        .args(libs.split_whitespace())
        .arg("-o")
        .arg(&exe)
        .status()
        .expect("a C compiler (cc) is required");
    assert!(st.success(), "the C program must compile and link against the installed emp.h and libemp.so");
    let run = Command::new(&exe).env("LD_LIBRARY_PATH", p("/usr/local/lib")).output().expect("run");
    assert!(
        run.status.success(),
        "the C program failed: {}{}",
        String::from_utf8_lossy(&run.stdout),
        String::from_utf8_lossy(&run.stderr)
    );
    let ldd = Command::new("ldd").arg(&exe).env("LD_LIBRARY_PATH", p("/usr/local/lib")).output().expect("ldd");
    let ldd = String::from_utf8_lossy(&ldd.stdout);
    assert!(
        ldd.contains(&format!("libemp.so.1 => {}", p("/usr/local/lib/libemp.so.1").display())),
        "the program does not load the installed libemp.so.1:\n{ldd}"
    );
}
