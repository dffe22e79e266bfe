//! Helpers for the TAP programs: TAP output (kselftest style, ending in
//! `N passed, N failed`), deterministic payloads, waiting for completions.

use std::time::Duration;

use emp::rdv::Job;
use emp::{Completion, Device, Endpoint, Status};

/// A TAP reporter. Only rank 0 prints; other ranks report failures on stderr.
pub struct Tap {
    planned: usize,
    n: usize,
    passed: usize,
    failed: usize,
    quiet: bool,
}

impl Tap {
    /// Starts a plan of `planned` tests.
    pub fn new(planned: usize, quiet: bool) -> Tap {
        if !quiet {
            println!("TAP version 13");
            println!("1..{planned}");
        }
        Tap { planned, n: 0, passed: 0, failed: 0, quiet }
    }

    /// Records one test.
    pub fn check(&mut self, name: &str, r: Result<(), String>) {
        self.n += 1;
        match r {
            Ok(()) => {
                self.passed += 1;
                if !self.quiet {
                    println!("ok {} - {name}", self.n);
                }
            }
            Err(e) => {
                self.failed += 1;
                if self.quiet {
                    eprintln!("not ok {} - {name} # {e}", self.n);
                } else {
                    println!("not ok {} - {name} # {e}", self.n);
                }
            }
        }
    }

    /// Prints the summary; returns the process exit code.
    pub fn finish(self) -> i32 {
        let missing = self.planned.saturating_sub(self.n);
        if !self.quiet {
            println!("# {} passed, {} failed", self.passed, self.failed + missing);
        }
        if self.failed + missing == 0 {
            0
        } else {
            1
        }
    }
}

/// Byte `i` of message `id`.
pub fn pattern(id: u64, out: &mut [u8]) {
    let mut x = id.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    for chunk in out.chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let b = x.to_le_bytes();
        chunk.copy_from_slice(&b[..chunk.len()]);
    }
}

/// Checks `got` against message `id`'s pattern; names the first bad byte.
pub fn check_pattern(id: u64, got: &[u8]) -> Result<(), String> {
    let mut want = vec![0u8; got.len()];
    pattern(id, &mut want);
    match got.iter().zip(&want).position(|(a, b)| a != b) {
        None => Ok(()),
        Some(i) => Err(format!("message {id}: byte {i} of {} differs", got.len())),
    }
}

/// Waits for the completion of `wr_id` ([`Device::wait_wr`]: others seen
/// meanwhile stay for later calls), with the error as text.
pub fn wait_for(dev: &mut Device, wr_id: u64, timeout: Duration) -> Result<Completion, String> {
    dev.wait_wr(wr_id, Some(timeout)).map_err(|e| match e {
        emp::Error::Timeout => format!("no completion for {wr_id} within {timeout:?}"),
        e => e.to_string(),
    })
}

/// Expects a successful completion.
pub fn expect_ok(c: &Completion) -> Result<(), String> {
    if c.status == Status::Success {
        Ok(())
    } else {
        Err(format!("wr {} completed with {}", c.wr_id, c.status.as_str()))
    }
}

/// One TAP test: its name and the check, run on every rank's context.
pub type TapCase<C> = (&'static str, fn(&mut C) -> Result<(), String>);

/// A chassis for integration tests: `emp cluster up` in a private
/// directory, `emp cluster down` on drop. Needs the release binaries and
/// the signed image (`make test` builds them; `EMP_BIN_DIR` overrides).
/// Runs `tests` in order on `ctx`, every rank together (`sync` after each
/// test), and exits with the TAP verdict.
pub fn run_tap<C>(quiet: bool, ctx: &mut C, tests: &[TapCase<C>], mut sync: impl FnMut(&mut C, &str)) -> ! {
    let mut tap = Tap::new(tests.len(), quiet);
    for (i, (name, f)) in tests.iter().enumerate() {
        let r = f(ctx);
        tap.check(name, r);
        sync(ctx, &format!("after{i}"));
    }
    std::process::exit(tap.finish());
}

/// What a TAP program does when it runs without a rendezvous directory
/// (a static job, e.g. in VMs).
pub enum WithoutRendezvous {
    /// Runs anyway.
    Run,
    /// Prints a TAP skip with this reason and exits 0.
    Skip(&'static str),
    /// Refuses to run (exit 2).
    Refuse,
}

/// The start of every TAP program: the job from the environment (at least
/// `min_ranks` ranks), the device, every rank's endpoint. A missing device
/// is a TAP skip (exit 1); a bad job exits 2.
pub fn tap_start(name: &str, min_ranks: usize, without_rdv: WithoutRendezvous) -> (Job, Device, Vec<Endpoint>) {
    let job = match Job::from_env() {
        Ok(j) if j.size < min_ranks => {
            eprintln!("{name}: needs at least {min_ranks} ranks");
            std::process::exit(2);
        }
        Ok(j) if !j.has_rendezvous() => match without_rdv {
            WithoutRendezvous::Run => j,
            WithoutRendezvous::Skip(why) => {
                println!("TAP version 13\n1..0 # SKIP {why}");
                std::process::exit(0);
            }
            WithoutRendezvous::Refuse => {
                eprintln!("{name}: needs a rendezvous directory (emp run)");
                std::process::exit(2);
            }
        },
        Ok(j) => j,
        Err(e) => {
            eprintln!("{name}: {e}");
            std::process::exit(2);
        }
    };
    let dev = match Device::open_for_job(&job) {
        Ok(d) => d,
        Err(e) => {
            println!("TAP version 13\n1..0 # SKIP cannot open the device: {e}");
            std::process::exit(1);
        }
    };
    let eps = job.endpoints(dev.endpoint()).expect("endpoint exchange");
    (job, dev, eps)
}

pub mod harness {
    use std::path::{Path, PathBuf};
    use std::process::{Command, Output};
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// Checks a TAP program's run: exit 0 and `passed` passed, 0 failed
    /// (its output is echoed for the test log).
    pub fn assert_tap(out: &Output, passed: usize) {
        let stdout = String::from_utf8_lossy(&out.stdout);
        print!("{stdout}");
        eprint!("{}", String::from_utf8_lossy(&out.stderr));
        assert!(out.status.success(), "exit {:?}", out.status);
        assert!(stdout.contains(&format!("# {passed} passed, 0 failed")), "TAP summary missing");
    }

    /// The repository root.
    pub fn root() -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).parent().expect("workspace").to_path_buf()
    }

    /// Where the release binaries are.
    pub fn bin_dir() -> PathBuf {
        std::env::var_os("EMP_BIN_DIR").map(PathBuf::from).unwrap_or_else(|| root().join("target/release"))
    }

    /// The `emp` command.
    pub fn emp() -> Command {
        let p = bin_dir().join("emp");
        assert!(
            p.exists(),
            "{} missing: run `make test` (it builds the release binaries and the firmware image)",
            p.display()
        );
        Command::new(p)
    }

    /// The signed firmware image.
    pub fn image() -> PathBuf {
        let p = root().join("firmware-blobs/emp-fw.bin");
        assert!(p.exists(), "{} missing: run `make firmware`", p.display());
        p
    }

    /// A running chassis.
    pub struct Cluster {
        /// Its state directory.
        pub dir: PathBuf,
    }

    impl Cluster {
        /// `emp cluster up <args>` in a directory named after the test.
        pub fn up(name: &str, args: &[&str]) -> Cluster {
            let dir = std::env::temp_dir().join(format!("emp-it-{}-{name}", std::process::id()));
            let _ = std::fs::remove_dir_all(&dir);
            let out = emp()
                .args(["cluster", "up", "--dir"])
                .arg(&dir)
                .arg("--firmware")
                .arg(image())
                .args(args)
                .output()
                .expect("emp");
            assert!(out.status.success(), "cluster up failed: {}", String::from_utf8_lossy(&out.stderr));
            Cluster { dir }
        }

        /// `emp run -n <n> -- argv…` on this chassis.
        pub fn run(&self, n: usize, argv: &[&str]) -> Output {
            emp()
                .args(["run", "--timeout", "300", "-n", &n.to_string(), "--dir"])
                .arg(&self.dir)
                .arg("--")
                .args(argv)
                .output()
                .expect("emp run")
        }

        /// Socket of NIC `n`.
        pub fn socket(&self, n: u16) -> PathBuf {
            self.dir.join(format!("nic{n}.sock"))
        }

        /// Socket of NIC `n`, as a string (for `Device::open_path`).
        pub fn sock(&self, n: u16) -> String {
            self.socket(n).to_string_lossy().into_owned()
        }

        /// The directory.
        pub fn path(&self) -> &Path {
            &self.dir
        }
    }

    impl Drop for Cluster {
        fn drop(&mut self) {
            let _ = emp().args(["cluster", "down", "--dir"]).arg(&self.dir).output();
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }

    /// Where `make build` puts the C library: `libemp.so.1` with versioned
    /// symbols, and its link-time name `libemp.so` (scripts/libemp-link.sh).
    pub fn libemp_dir() -> PathBuf {
        let lib = bin_dir().join("lib");
        assert!(
            lib.join("libemp.so.1").exists() && lib.join("libemp.so").exists(),
            "{}/libemp.so.1 or libemp.so missing: run `make build` (it links the C library from libemp's staticlib)",
            lib.display()
        );
        lib
    }

    /// Compiles `libemp/examples/c/<name>.c` against libemp.so.1 (-Werror).
    pub fn compile_c_example(name: &str) -> PathBuf {
        // Tests compile the same example in parallel: one path per call.
        static CALLS: AtomicUsize = AtomicUsize::new(0);
        let call = CALLS.fetch_add(1, Ordering::Relaxed);
        let out_bin = std::env::temp_dir().join(format!("emp-c-{name}-{}-{call}", std::process::id()));
        let lib = libemp_dir();
        let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
        let st = Command::new(&cc)
            .args(["-Wall", "-Wextra", "-Werror", "-O2", "-I"])
            .arg(root().join("libemp/include"))
            .arg(root().join(format!("libemp/examples/c/{name}.c")))
            .arg("-L")
            .arg(&lib)
            .arg("-lemp")
            // RPATH, not RUNPATH: cargo's LD_LIBRARY_PATH must not win over
            // the release library.
            .arg("-Wl,--disable-new-dtags")
            .arg(format!("-Wl,-rpath,{}", lib.display()))
            .arg("-o")
            .arg(&out_bin)
            .status()
            .expect("a C compiler (cc) is required");
        assert!(st.success(), "the C example {name} must compile");
        out_bin
    }
}

/// Two network namespaces joined by a veth pair, for the wire tests that
/// run one `emp-nicd` per namespace (tests/tests/netns_*.rs).
pub mod veth {
    use std::process::{Child, Command};

    /// `02:00:…` as `ip link` writes it.
    pub fn mac_str(m: &[u8; 6]) -> String {
        m.iter().map(|b| format!("{b:02x}")).collect::<Vec<_>>().join(":")
    }

    /// The process may make namespaces (CAP_NET_ADMIN in its effective set).
    pub fn has_cap_net_admin() -> bool {
        let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
        let eff = status.lines().find_map(|l| l.strip_prefix("CapEff:")).map(|v| v.trim().to_string());
        eff.and_then(|v| u64::from_str_radix(&v, 16).ok()).is_some_and(|c| c & (1 << 12) != 0)
    }

    /// Runs a command that must succeed.
    pub fn sh(args: &[&str]) {
        let out = Command::new(args[0]).args(&args[1..]).output().expect("run");
        assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
    }

    /// Namespaces `<prefix>-<tag><pid>-{a,b}` with veth ends
    /// `<prefix><tag><pid>{a,b}`, removed on drop (whatever happened).
    pub struct Bed {
        pub ns: [String; 2],
        pub ifs: [String; 2],
    }

    impl Bed {
        /// End i gets `macs[i]` and `ips[i]`/24; both ends and `lo` up.
        pub fn up(prefix: &str, tag: &str, macs: &[[u8; 6]; 2], ips: &[[u8; 4]; 2]) -> Bed {
            let id = std::process::id() % 100_000;
            let bed = Bed {
                ns: [format!("{prefix}-{tag}{id}-a"), format!("{prefix}-{tag}{id}-b")],
                ifs: [format!("{prefix}{tag}{id}a"), format!("{prefix}{tag}{id}b")],
            };
            for n in &bed.ns {
                let _ = Command::new("ip").args(["netns", "del", n]).output();
                sh(&["ip", "netns", "add", n]);
            }
            sh(&["ip", "link", "add", &bed.ifs[0], "type", "veth", "peer", "name", &bed.ifs[1]]);
            for (i, (ns, ifn)) in bed.ns.iter().zip(&bed.ifs).enumerate() {
                sh(&["ip", "link", "set", ifn, "netns", ns]);
                let ex = |a: &[&str]| {
                    let mut v = vec!["ip", "netns", "exec", ns];
                    v.extend_from_slice(a);
                    sh(&v);
                };
                ex(&["ip", "link", "set", "dev", ifn, "address", &mac_str(&macs[i])]);
                let ip = ips[i];
                ex(&["ip", "addr", "add", &format!("{}.{}.{}.{}/24", ip[0], ip[1], ip[2], ip[3]), "dev", ifn]);
                ex(&["ip", "link", "set", "lo", "up"]);
                ex(&["ip", "link", "set", ifn, "up"]);
            }
            bed
        }
    }

    impl Drop for Bed {
        fn drop(&mut self) {
            // Deleting a namespace deletes the veth end in it, and so the pair.
            for n in &self.ns {
                let _ = Command::new("ip").args(["netns", "del", n]).output();
            }
        }
    }

    /// A well-formed ACK frame from node `src` to node `dst`, for forging.
    pub fn ack(src: u16, dst: u16) -> Vec<u8> {
        use emp_uapi::wire::{emit_ack, AckBody, FrameHeader, FrameKind, WIRE_VERSION};
        let hdr = FrameHeader {
            version: WIRE_VERSION,
            kind: FrameKind::Ack as u8,
            src_node: src,
            dst_node: dst,
            frame_count: 1,
            ..Default::default()
        };
        let mut out = vec![0u8; 128];
        let n = emit_ack(&hdr, &AckBody::default(), &mut out).expect("emit");
        out.truncate(n);
        out
    }

    /// Runs `f` on a thread that entered network namespace `ns` (setns is per thread).
    pub fn in_netns<T: Send>(ns: &str, f: impl FnOnce() -> T + Send) -> T {
        std::thread::scope(|s| {
            s.spawn(|| {
                let file = std::fs::File::open(format!("/var/run/netns/{ns}")).expect("netns file");
                // SAFETY: setns(2) on an open namespace file; affects this thread only.
                let r = unsafe { libc::setns(std::os::fd::AsRawFd::as_raw_fd(&file), libc::CLONE_NEWNET) };
                assert_eq!(r, 0, "setns {ns}: {}", std::io::Error::last_os_error());
                f()
            })
            .join()
            .expect("netns thread")
        })
    }

    /// Daemons killed on drop.
    pub struct Daemons(pub Vec<Child>);

    impl Daemons {
        /// SIGTERM to each, then wait for all.
        pub fn stop(&mut self) {
            for c in &mut self.0 {
                // SAFETY: kill(2) on our own child's pid.
                unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
            }
            for c in &mut self.0 {
                let _ = c.wait();
            }
        }
    }

    impl Drop for Daemons {
        fn drop(&mut self) {
            for c in &mut self.0 {
                let _ = c.kill();
                let _ = c.wait();
            }
        }
    }
}

/// A point-to-point TAP program's state: its job, device, peers' endpoints,
/// a send and a receive buffer, and the next work-request id
/// (tap-p2p, tap-match).
pub struct P2pCtx {
    pub dev: Device,
    pub job: Job,
    pub eps: Vec<Endpoint>,
    pub sbuf: emp::Buffer,
    pub rbuf: emp::Buffer,
    next_wr: u64,
    timeout: Duration,
}

impl P2pCtx {
    /// `timeout` bounds each [`P2pCtx::wait`].
    pub fn new(
        dev: Device,
        job: Job,
        eps: Vec<Endpoint>,
        sbuf: emp::Buffer,
        rbuf: emp::Buffer,
        timeout: Duration,
    ) -> P2pCtx {
        P2pCtx { dev, job, eps, sbuf, rbuf, next_wr: 0, timeout }
    }
    pub fn rank(&self) -> usize {
        self.job.rank
    }
    /// A fresh work-request id.
    pub fn wr(&mut self) -> u64 {
        self.next_wr += 1;
        self.next_wr
    }
    pub fn sync(&mut self, name: &str) -> Result<(), String> {
        self.job.barrier(&mut self.dev, name).map_err(|e| e.to_string())
    }
    pub fn wait(&mut self, wr: u64) -> Result<Completion, String> {
        wait_for(&mut self.dev, wr, self.timeout)
    }
    /// Sends `len` bytes of the send buffer at `off` to rank `to`.
    pub fn send(&mut self, to: usize, tag: u64, off: usize, len: usize) -> Result<u64, String> {
        let wr = self.wr();
        let s = self.sbuf.sge(off, len);
        self.dev.post_send(wr, self.eps[to], tag, &[s]).map_err(|e| e.to_string())?;
        Ok(wr)
    }
    /// Posts a receive of `len` bytes into the receive buffer at `off`.
    pub fn recv(&mut self, from: Endpoint, tag: u64, ignore: u64, off: usize, len: usize) -> Result<u64, String> {
        let wr = self.wr();
        let s = self.rbuf.sge(off, len);
        self.dev.post_recv(wr, from, tag, ignore, &[s]).map_err(|e| e.to_string())?;
        Ok(wr)
    }
    /// NIC counter `c` (emp_uapi::sram::counter).
    pub fn counter(&self, c: usize) -> Result<u64, String> {
        Ok(self.dev.nic_counters().map_err(|e| e.to_string())?[c])
    }
    /// NIC counter `c` once it reaches `min`, or its value after a second.
    /// The NIC publishes its counters at the end of the event that
    /// changed them, which may come just after the completion it wrote
    /// during that event: a read right after a completion can be stale.
    pub fn counter_reaching(&self, c: usize, min: u64) -> Result<u64, String> {
        let t0 = std::time::Instant::now();
        loop {
            let v = self.counter(c)?;
            if v >= min || t0.elapsed() > Duration::from_secs(1) {
                return Ok(v);
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}
