//! `emp soak --minutes N`: a chassis of NICs losing frames on the wire, N
//! ranks running a random mix of point-to-point messages (0 B to a few MiB,
//! tag classes, any-source receives), remote writes, reads and atomics, and
//! rounds of NIC collectives, while ranks are killed (SIGKILL) and replaced
//! at random. Every byte that arrives is checked (`verify`), and at the end
//! every message a sender saw complete must have arrived.
//!
//! The soak is the ranks' launcher (as `emp run`, one rank per NIC, rank and
//! size in `EMP_RANK`/`EMP_SIZE`) and their control channel: a rank
//! (`emp soak-rank`, `rank.rs`) writes lines to its stdout, the soak answers
//! on its stdin.
//!
//! Rank → soak: `HELLO node port remote-key`, `STAT k=v …`, `ERR kind op
//! peer detail` (kind `status:<Status>`, `verify`, `hang`, …; peer
//! `peer=rank/incarnation`, `src=node:port` or `round=N`), `COLLDONE N`,
//! `COLLFAIL N`, `SENT dst incarnation count`, `STOPPED`, `FINAL`.
//!
//! Soak → rank: `PEER rank incarnation node port remote-key`, `GO`, `COLL N
//! members`, `ABORT N`, `STOP`, `EXPECT src incarnation count`, `CHECK`,
//! `EXIT`.
//!
//! A rank reports facts; the soak, which knows which incarnations it killed
//! and which collective rounds a kill interrupted, sorts error completions
//! into expected ones (the operation involved a killed incarnation or an
//! interrupted round) and unexpected ones (everything else, and every
//! verification failure or hang). The exit status is 0 only without
//! unexpected ones.

mod rank;
pub mod verify;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, SyncSender};
use std::time::{Duration, Instant};

use clap::{Args, ValueEnum};
use emp::Endpoint;
use emp_uapi::sram::counter;

use crate::cluster::{self, UpArgs, WireKind};
use verify::{mix, Rng};

pub use rank::rank;

/// Ranks a soak can run (each has a part of every other's window).
pub const MAX_RANKS: usize = 16;
/// How long the end phases (a respawn's HELLO, the last round, STOP,
/// FINAL, exit) may take each.
const END_PHASE: Duration = Duration::from_secs(60);
/// A collective round that has not finished after this is a hang.
const ROUND_DEADLINE: Duration = Duration::from_secs(60);
/// Lines queued from the ranks at most (their writes block beyond).
const LINE_QUEUE: usize = 4096;

/// A fault the soak injects into itself, to show it catches it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Inject {
    /// Rank 1 flips a byte of its 50th non-empty message after writing it.
    Corrupt,
    /// Rank 2 ignores its 50th received message (a lost completion).
    LoseRecv,
    /// Rank 1 ignores its 50th send completion (the send never completes).
    LoseSend,
}

/// `emp soak` options.
#[derive(Args, Debug, Clone)]
pub struct SoakArgs {
    /// How long the traffic runs (fractions allowed: 0.5 = 30 s).
    #[arg(long, default_value_t = 5.0)]
    pub minutes: f64,
    /// Ranks, one per NIC.
    #[arg(short = 'n', long, default_value_t = 8)]
    pub ranks: usize,
    /// Frame loss probability on the wire.
    #[arg(long, default_value_t = 0.05)]
    pub loss: f64,
    /// Seed of the schedule (kills, rounds, each rank's operations)
    /// [default: from the clock, printed].
    #[arg(long)]
    pub seed: Option<u64>,
    /// Mean seconds between two kills of a random rank (0: no kills).
    #[arg(long, default_value_t = 6.0)]
    pub kill_interval: f64,
    /// Mean seconds between two rounds of collectives (0: none).
    #[arg(long, default_value_t = 4.0)]
    pub coll_interval: f64,
    /// Largest message in bytes.
    #[arg(long, default_value_t = 2 << 20)]
    pub max_msg: usize,
    /// Wire backend.
    #[arg(long, value_enum, default_value_t = WireKind::Mem)]
    pub wire: WireKind,
    /// Signed firmware image [default: as `emp cluster up`].
    #[arg(long)]
    pub firmware: Option<PathBuf>,
    /// Print the summary as one JSON document on stdout (the rest goes to stderr).
    #[arg(long)]
    pub json: bool,
    /// Inject a fault the soak must catch (a self-check).
    #[arg(long, value_enum, hide = true)]
    pub inject: Option<Inject>,
    /// Count as unexpected the two effects of an endpoint (node, port)
    /// reused by a replacement (docs/soak.md): a message sent to the old
    /// process delivered to the new one, and the first operation on the new
    /// one failing RemotePortClosed.
    #[arg(long)]
    pub strict_endpoints: bool,
    /// Seconds after which a rank reports an operation still outstanding
    /// as hung (the NIC gives up on a dead peer after ~3 s, on a read's
    /// response after its 30 s idle timeout).
    #[arg(long, default_value_t = 45, hide = true)]
    pub op_deadline: u64,
}

/// `emp soak-rank` options (given by the soak).
#[derive(Args, Debug, Clone)]
pub struct RankArgs {
    /// The soak's seed.
    #[arg(long)]
    pub seed: u64,
    /// This process's incarnation of its rank (0 first, +1 per replacement).
    #[arg(long)]
    pub incarnation: u64,
    /// Largest message in bytes.
    #[arg(long)]
    pub max_msg: usize,
    /// Fault to inject.
    #[arg(long, value_enum)]
    pub inject: Option<Inject>,
    /// Seconds before an outstanding operation is reported hung.
    #[arg(long, default_value_t = 45)]
    pub op_deadline: u64,
}

/// Counters a rank reports in its STAT lines, summed over incarnations.
const STAT_KEYS: [&str; 14] = [
    "sends",
    "send_bytes",
    "recvs",
    "recv_bytes",
    "writes",
    "write_bytes",
    "reads",
    "read_bytes",
    "atomics",
    "resyncs",
    "stale",
    "colls",
    "coll_bytes",
    "rounds",
];

/// One rank's current process.
struct Worker {
    child: Option<Child>,
    stdin: Option<ChildStdin>,
    inc: u64,
    hello: Option<(Endpoint, u64)>,
    stat: BTreeMap<String, u64>,
    stopped: bool,
    sent: Vec<(usize, u64, u64)>,
    final_seen: bool,
    /// When its replacement is to be started (after a kill).
    respawn_at: Option<Instant>,
}

struct RoundState {
    round: u64,
    started: Instant,
    members: Vec<(usize, u64)>,
    finished: HashSet<usize>,
}

/// An error a rank reported, sorted.
#[derive(Default)]
struct ErrorCounts {
    expected: BTreeMap<String, u64>,
    unexpected: BTreeMap<String, u64>,
    /// The first unexpected ones, verbatim (rank/incarnation: line).
    samples: Vec<String>,
    /// Unexpected ones printed as they came (the rest only counted).
    printed: u64,
}

/// Unexpected errors printed as they come; the summary counts them all.
const PRINT_UNEXPECTED: u64 = 100;

impl ErrorCounts {
    fn add(&mut self, kind: &str, expected: bool, who: &str, line: &str) {
        if expected {
            *self.expected.entry(kind.to_string()).or_default() += 1;
        } else {
            *self.unexpected.entry(kind.to_string()).or_default() += 1;
            if self.samples.len() < 20 {
                self.samples.push(format!("{who}: {line}"));
            }
            self.printed += 1;
            if self.printed <= PRINT_UNEXPECTED {
                eprintln!("emp soak: UNEXPECTED {who}: {line}");
            } else if self.printed == PRINT_UNEXPECTED + 1 {
                eprintln!("emp soak: more unexpected errors: counted, not printed");
            }
        }
    }

    fn unexpected_total(&self) -> u64 {
        self.unexpected.values().sum()
    }
}

struct Soak {
    a: SoakArgs,
    seed: u64,
    dir: PathBuf,
    exe: PathBuf,
    workers: Vec<Worker>,
    lines: Receiver<(usize, u64, String)>,
    lines_tx: SyncSender<(usize, u64, String)>,
    history: HashMap<(usize, u64), Endpoint>,
    killed: HashSet<(usize, u64)>,
    /// Last STAT of every incarnation that ended.
    ended_stats: Vec<BTreeMap<String, u64>>,
    errors: ErrorCounts,
    round: Option<RoundState>,
    next_round: u64,
    aborted_rounds: HashSet<u64>,
    rounds_done: u64,
    rounds_aborted: u64,
    kills: u64,
    restarts: u64,
    started: bool,
    /// A rank exited by itself: the job is broken, the soak ends at once.
    broken: bool,
}

/// Stops the chassis on every path (the ranks are killed by `soak` before
/// this drops) and removes its directory, unless the soak failed: then the
/// NICs' logs stay there for the post-mortem.
struct Cleanup {
    dir: PathBuf,
    keep: bool,
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        let _ = cluster::down(&self.dir);
        if self.keep {
            eprintln!("emp soak: the NICs' logs are kept in {}", self.dir.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// `emp soak`.
pub fn soak(a: &SoakArgs) -> Result<(), String> {
    if a.ranks < 2 || a.ranks > MAX_RANKS {
        return Err(format!("--ranks must be 2..={MAX_RANKS}"));
    }
    if !(0.0..0.5).contains(&a.loss) {
        return Err("--loss must be in [0, 0.5)".into());
    }
    let positive = |x: f64| x.is_finite() && x > 0.0;
    if !positive(a.minutes)
        || !(a.kill_interval == 0.0 || positive(a.kill_interval))
        || !(a.coll_interval == 0.0 || positive(a.coll_interval))
    {
        return Err("--minutes must be > 0, --kill-interval and --coll-interval >= 0".into());
    }
    if a.max_msg == 0 || a.op_deadline == 0 {
        return Err("--max-msg and --op-deadline must be > 0".into());
    }
    let seed = a.seed.unwrap_or_else(|| {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(1, |d| d.as_nanos() as u64)
    });
    let dir = std::env::temp_dir().join(format!("emp-soak-{}", std::process::id()));
    let up = UpArgs {
        nics: a.ranks as u16,
        wire: a.wire,
        loss: a.loss,
        dup: 0.0,
        reorder: 0.0,
        ports: 8,
        mtu: None,
        cpu_plan: "base".into(),
        nic_cpus: 1,
        firmware: a.firmware.clone(),
        trusted_keys: None,
        udp_base: 20000 + (std::process::id() % 2000) as u16 * MAX_RANKS as u16,
        nicd_args: None,
    };
    let note = cluster::start(&dir, &up)?;
    let mut cleanup = Cleanup { dir: dir.clone(), keep: false };
    say(a, format_args!("emp soak: {note}; seed {seed}; loss {}; {} ranks; {} min", a.loss, a.ranks, a.minutes));
    let (lines_tx, lines) = mpsc::sync_channel(LINE_QUEUE);
    let mut s = Soak {
        a: a.clone(),
        seed,
        dir,
        exe: std::env::current_exe().map_err(|e| e.to_string())?,
        workers: Vec::new(),
        lines,
        lines_tx,
        history: HashMap::new(),
        killed: HashSet::new(),
        ended_stats: Vec::new(),
        errors: ErrorCounts::default(),
        round: None,
        next_round: 1,
        aborted_rounds: HashSet::new(),
        rounds_done: 0,
        rounds_aborted: 0,
        kills: 0,
        restarts: 0,
        started: false,
        broken: false,
    };
    let result = s.run();
    for w in &mut s.workers {
        if let Some(mut c) = w.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
    // A self-check's failure is the point: nothing to look at afterwards.
    cleanup.keep = result.is_err() && a.inject.is_none();
    result
}

fn say(a: &SoakArgs, line: std::fmt::Arguments) {
    if a.json {
        eprintln!("{line}");
    } else {
        println!("{line}");
    }
}

impl Soak {
    fn spawn(&mut self, rank: usize, inc: u64) -> Result<Worker, String> {
        let arena_mb = (16 * self.a.max_msg + (8 << 20)) >> 20;
        let mut cmd = Command::new(&self.exe);
        cmd.arg("soak-rank")
            .args(["--seed", &self.seed.to_string(), "--incarnation", &inc.to_string()])
            .args(["--max-msg", &self.a.max_msg.to_string(), "--op-deadline", &self.a.op_deadline.to_string()])
            .args(self.a.inject.map(|i| format!("--inject={}", i.to_possible_value().expect("named").get_name())))
            .env("EMP_DEVICE", cluster::socket(&self.dir, rank as u16))
            .env("EMP_RANK", rank.to_string())
            .env("EMP_SIZE", self.a.ranks.to_string())
            .env("EMP_ARENA_MB", arena_mb.to_string())
            .env_remove("EMP_RDV_DIR")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        let mut child = cmd.spawn().map_err(|e| format!("{}: {e}", self.exe.display()))?;
        let stdout = child.stdout.take().expect("piped");
        let stdin = child.stdin.take();
        let tx = self.lines_tx.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send((rank, inc, line)).is_err() {
                    return;
                }
            }
            let _ = tx.send((rank, inc, "EOF".into()));
        });
        Ok(Worker {
            child: Some(child),
            stdin,
            inc,
            hello: None,
            stat: BTreeMap::new(),
            stopped: false,
            sent: Vec::new(),
            final_seen: false,
            respawn_at: None,
        })
    }

    fn send(&mut self, rank: usize, line: &str) {
        let w = &mut self.workers[rank];
        if let Some(i) = w.stdin.as_mut() {
            // A rank that died is noticed by its EOF.
            let _ = writeln!(i, "{line}").and_then(|()| i.flush());
        }
    }

    fn peer_line(&self, rank: usize) -> Option<String> {
        let w = &self.workers[rank];
        let (ep, key) = w.hello?;
        Some(format!("PEER {rank} {} {} {} {key}", w.inc, ep.node, ep.port))
    }

    fn live(&self, rank: usize) -> bool {
        let w = &self.workers[rank];
        w.child.is_some() && w.hello.is_some()
    }

    fn all_live(&self) -> bool {
        (0..self.workers.len()).all(|r| self.live(r))
    }

    fn run(&mut self) -> Result<(), String> {
        let n = self.a.ranks;
        let t0 = Instant::now();
        for r in 0..n {
            let w = self.spawn(r, 0)?;
            self.workers.push(w);
        }
        let mut rng = Rng::new(mix(&[0x50A4, self.seed]));
        let exp = |rng: &mut Rng, mean: f64| Duration::from_secs_f64(-mean * (1.0 - rng.unit()).ln());
        let traffic = Duration::from_secs_f64(self.a.minutes * 60.0);
        let mut next_kill = (self.a.kill_interval > 0.0).then(|| t0 + exp(&mut rng, self.a.kill_interval));
        let mut next_coll = (self.a.coll_interval > 0.0).then(|| t0 + exp(&mut rng, self.a.coll_interval));
        // Traffic, kills and rounds until the time is up.
        while t0.elapsed() < traffic || !self.started {
            if self.broken {
                return self.give_up(t0.elapsed());
            }
            if !self.started && t0.elapsed() > END_PHASE {
                return Err("the ranks did not all start (no HELLO) within 60 s".into());
            }
            self.pump(Duration::from_millis(20))?;
            let now = Instant::now();
            self.respawn_due(now)?;
            if !self.started {
                continue;
            }
            if next_kill.is_some_and(|k| now >= k) {
                let victim = rng.range(0, n as u64 - 1) as usize;
                let delay = Duration::from_millis(rng.range(0, 500));
                if self.live(victim) {
                    self.kill(victim, now + delay);
                }
                next_kill = Some(now + exp(&mut rng, self.a.kill_interval));
            }
            self.check_round()?;
            if next_coll.is_some_and(|c| now >= c) && self.round.is_none() && self.all_live() {
                self.start_round();
                next_coll = Some(now + exp(&mut rng, self.a.coll_interval));
            }
        }
        say(&self.a, format_args!("emp soak: traffic time over; draining"));
        // Let the last replacements start and the last round end.
        let end = Instant::now() + END_PHASE;
        while self.workers.iter().any(|w| w.respawn_at.is_some() || w.hello.is_none()) || self.round.is_some() {
            if self.broken {
                return self.give_up(t0.elapsed());
            }
            if Instant::now() > end {
                self.errors.add("hang", false, "soak", "the last replacement or collective round did not finish");
                break;
            }
            self.pump(Duration::from_millis(20))?;
            self.respawn_due(Instant::now())?;
            self.check_round()?;
        }
        // Stop: every rank finishes its operations and says what it sent.
        for r in 0..n {
            self.send(r, "STOP");
        }
        self.wait_all("STOPPED", |w| w.stopped)?;
        if self.broken {
            return self.give_up(t0.elapsed());
        }
        let mut expect: Vec<Vec<String>> = vec![Vec::new(); n];
        for src in 0..n {
            let sinc = self.workers[src].inc;
            for dst in (0..n).filter(|&d| d != src) {
                let dinc = self.workers[dst].inc;
                let count = self.workers[src]
                    .sent
                    .iter()
                    .filter(|&&(d, i, _)| d == dst && i == dinc)
                    .map(|&(_, _, c)| c)
                    .sum::<u64>();
                expect[dst].push(format!("EXPECT {src} {sinc} {count}"));
            }
        }
        for (dst, lines) in expect.into_iter().enumerate() {
            for l in lines {
                self.send(dst, &l);
            }
            self.send(dst, "CHECK");
        }
        self.wait_all("FINAL", |w| w.final_seen)?;
        if self.broken {
            return self.give_up(t0.elapsed());
        }
        let nic = self.nic_counters();
        for r in 0..n {
            self.send(r, "EXIT");
        }
        let end = Instant::now() + Duration::from_secs(10);
        for r in 0..n {
            if let Some(mut c) = self.workers[r].child.take() {
                while matches!(c.try_wait(), Ok(None)) && Instant::now() < end {
                    std::thread::sleep(Duration::from_millis(10));
                }
                match c.try_wait() {
                    Ok(Some(st)) if st.success() => {}
                    Ok(Some(st)) => self.errors.add("exit", false, &format!("rank {r}"), &format!("exited with {st}")),
                    _ => {
                        let _ = c.kill();
                        let _ = c.wait();
                        self.errors.add("hang", false, &format!("rank {r}"), "did not exit after EXIT");
                    }
                }
            }
        }
        let elapsed = t0.elapsed();
        self.report(elapsed, &nic)
    }

    /// Ends a broken soak: the ranks are killed, the NICs' counters read,
    /// the summary printed (a failure).
    fn give_up(&mut self, elapsed: Duration) -> Result<(), String> {
        eprintln!("emp soak: a rank exited by itself; stopping");
        for w in &mut self.workers {
            if let Some(mut c) = w.child.take() {
                let _ = c.kill();
                let _ = c.wait();
            }
            self.ended_stats.push(std::mem::take(&mut w.stat));
        }
        let nic = self.nic_counters();
        self.report(elapsed, &nic)
    }

    /// Waits until every rank has reached a phase, taking lines meanwhile.
    fn wait_all(&mut self, what: &str, done: impl Fn(&Worker) -> bool) -> Result<(), String> {
        let end = Instant::now() + END_PHASE;
        while !self.workers.iter().all(&done) && !self.broken {
            if Instant::now() > end {
                let late: Vec<String> =
                    (0..self.workers.len()).filter(|&r| !done(&self.workers[r])).map(|r| r.to_string()).collect();
                self.errors.add("hang", false, "soak", &format!("ranks {} never said {what}", late.join(",")));
                return Ok(());
            }
            self.pump(Duration::from_millis(20))?;
        }
        Ok(())
    }

    fn kill(&mut self, rank: usize, respawn_at: Instant) {
        let w = &mut self.workers[rank];
        if let Some(mut c) = w.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        w.stdin = None;
        let inc = w.inc;
        self.killed.insert((rank, inc));
        self.ended_stats.push(std::mem::take(&mut w.stat));
        w.respawn_at = Some(respawn_at);
        self.kills += 1;
        if let Some(rd) = &self.round {
            if rd.members.contains(&(rank, inc)) {
                let round = rd.round;
                self.aborted_rounds.insert(round);
                for r in 0..self.workers.len() {
                    self.send(r, &format!("ABORT {round}"));
                }
            }
        }
    }

    fn respawn_due(&mut self, now: Instant) -> Result<(), String> {
        for r in 0..self.workers.len() {
            if self.workers[r].respawn_at.is_some_and(|t| now >= t) {
                let inc = self.workers[r].inc + 1;
                self.workers[r] = self.spawn(r, inc)?;
                self.restarts += 1;
            }
        }
        Ok(())
    }

    fn start_round(&mut self) {
        let round = self.next_round;
        self.next_round += 1;
        let members: Vec<String> = self
            .workers
            .iter()
            .map(|w| w.hello.map_or(String::new(), |(ep, _)| format!("{}:{}", ep.node, ep.port)))
            .collect();
        let line = format!("COLL {round} {}", members.join(","));
        self.round = Some(RoundState {
            round,
            started: Instant::now(),
            members: self.workers.iter().enumerate().map(|(r, w)| (r, w.inc)).collect(),
            finished: HashSet::new(),
        });
        for r in 0..self.workers.len() {
            self.send(r, &line);
        }
    }

    /// Ends the current round when every member still alive has finished it.
    fn check_round(&mut self) -> Result<(), String> {
        let Some(rd) = &self.round else { return Ok(()) };
        let alive_members: Vec<usize> =
            rd.members.iter().filter(|&&m| !self.killed.contains(&m)).map(|&(r, _)| r).collect();
        if alive_members.iter().all(|r| rd.finished.contains(r)) {
            if self.aborted_rounds.contains(&rd.round) {
                self.rounds_aborted += 1;
            } else {
                self.rounds_done += 1;
            }
            self.round = None;
        } else if rd.started.elapsed() > ROUND_DEADLINE {
            let line = format!("collective round {} did not finish in {ROUND_DEADLINE:?}", rd.round);
            self.errors.add("hang", false, "soak", &line);
            let round = rd.round;
            self.aborted_rounds.insert(round);
            self.round = None;
            for r in 0..self.workers.len() {
                self.send(r, &format!("ABORT {round}"));
            }
        }
        Ok(())
    }

    /// Takes the ranks' lines for up to `wait`.
    fn pump(&mut self, wait: Duration) -> Result<(), String> {
        let end = Instant::now() + wait;
        loop {
            let left = end.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok((rank, inc, line)) => self.line(rank, inc, &line),
                Err(RecvTimeoutError::Timeout) => return Ok(()),
                Err(RecvTimeoutError::Disconnected) => return Err("line channel closed".into()),
            }
        }
    }

    fn line(&mut self, rank: usize, inc: u64, line: &str) {
        let who = format!("rank {rank}/{inc}");
        let current = self.workers[rank].inc == inc && self.workers[rank].child.is_some();
        let mut w = line.split_whitespace();
        match w.next() {
            Some("ERR") => {
                let kind = w.next().unwrap_or("?").to_string();
                let _op = w.next();
                let peer = w.next().unwrap_or("-");
                let (kind, expected) = self.classify(kind, peer, line);
                self.errors.add(&kind, expected, &who, line);
            }
            _ if !current => {} // A killed incarnation's last words.
            Some("HELLO") => {
                let v: Vec<u64> = w.filter_map(|x| x.parse().ok()).collect();
                if v.len() != 3 {
                    self.errors.add("protocol", false, &who, line);
                    return;
                }
                let ep = Endpoint { node: v[0] as u16, port: v[1] as u16 };
                self.workers[rank].hello = Some((ep, v[2]));
                self.history.insert((rank, inc), ep);
                self.announce(rank);
            }
            Some("STAT") => {
                let stat = &mut self.workers[rank].stat;
                for kv in w {
                    if let Some((k, v)) = kv.split_once('=') {
                        stat.insert(k.to_string(), v.parse().unwrap_or(0));
                    }
                }
            }
            Some("COLLDONE") | Some("COLLFAIL") => {
                let round: u64 = w.next().and_then(|v| v.parse().ok()).unwrap_or(0);
                if let Some(rd) = self.round.as_mut().filter(|rd| rd.round == round) {
                    rd.finished.insert(rank);
                }
            }
            Some("SENT") => {
                let v: Vec<u64> = w.filter_map(|x| x.parse().ok()).collect();
                if v.len() == 3 {
                    self.workers[rank].sent.push((v[0] as usize, v[1], v[2]));
                }
            }
            Some("STOPPED") => self.workers[rank].stopped = true,
            Some("FINAL") => self.workers[rank].final_seen = true,
            Some("EOF") => {
                let w = &mut self.workers[rank];
                if let Some(mut c) = w.child.take() {
                    let st = c.wait().map(|s| s.to_string()).unwrap_or_else(|e| e.to_string());
                    self.errors.add("exit", false, &who, &format!("the rank exited by itself: {st}"));
                    w.stdin = None;
                    self.broken = true;
                }
            }
            _ => self.errors.add("protocol", false, &who, line),
        }
    }

    /// An error's kind as counted, and whether a kill explains it.
    fn classify(&self, kind: String, peer: &str, line: &str) -> (String, bool) {
        let endpoint_reuse = |k: &str| (k.to_string(), !self.a.strict_endpoints);
        if kind == "stale" && self.involves_killed(peer) {
            // Sent to the dead process, delivered to its replacement.
            return endpoint_reuse("stale-delivery");
        }
        if kind == "status:RemotePortClosed" && line.ends_with(" first-to-incarnation") && self.reused(peer) {
            // The sender's NIC still named the predecessor's generation.
            return endpoint_reuse("stale-generation");
        }
        let expected = kind.starts_with("status:") && self.involves_killed(peer);
        (kind, expected)
    }

    /// Does `peer=r/i` name an incarnation whose endpoint a killed
    /// predecessor had?
    fn reused(&self, peer: &str) -> bool {
        let Some((r, i)) = peer.strip_prefix("peer=").and_then(|p| p.split_once('/')) else { return false };
        let (Ok(r), Ok(i)) = (r.parse::<usize>(), i.parse::<u64>()) else { return false };
        let Some(ep) = self.history.get(&(r, i)) else { return false };
        (0..i).any(|j| self.killed.contains(&(r, j)) && self.history.get(&(r, j)) == Some(ep))
    }

    /// Does an error's peer field name a killed incarnation (`peer=r/i`),
    /// an endpoint one of them had (`src=node:port`), or a round a kill
    /// interrupted (`round=N`)?
    fn involves_killed(&self, peer: &str) -> bool {
        if let Some(p) = peer.strip_prefix("peer=") {
            let Some((r, i)) = p.split_once('/') else { return false };
            return matches!((r.parse(), i.parse()), (Ok(r), Ok(i)) if self.killed.contains(&(r, i)));
        }
        if let Some(p) = peer.strip_prefix("src=") {
            let Some((n, port)) = p.split_once(':') else { return false };
            let (Ok(node), Ok(port)) = (n.parse(), port.parse()) else { return false };
            let ep = Endpoint { node, port };
            return self.killed.iter().any(|k| self.history.get(k) == Some(&ep));
        }
        if let Some(n) = peer.strip_prefix("round=") {
            return n.parse().is_ok_and(|n: u64| self.aborted_rounds.contains(&n));
        }
        false
    }

    /// A rank said HELLO: at the start, once all have, everyone gets the
    /// table and GO; later (a replacement), the others learn it first.
    fn announce(&mut self, rank: usize) {
        let n = self.workers.len();
        if !self.started {
            if !(0..n).all(|r| self.workers[r].hello.is_some()) {
                return;
            }
            self.started = true;
            let table: Vec<String> = (0..n).filter_map(|r| self.peer_line(r)).collect();
            for r in 0..n {
                for l in &table {
                    self.send(r, l);
                }
                self.send(r, "GO");
            }
            return;
        }
        let Some(mine) = self.peer_line(rank) else { return };
        for r in (0..n).filter(|&r| r != rank) {
            self.send(r, &mine);
        }
        let table: Vec<String> = (0..n).filter(|&r| r != rank).filter_map(|r| self.peer_line(r)).collect();
        for l in &table {
            self.send(rank, l);
        }
        self.send(rank, "GO");
    }

    /// Every NIC's counters, summed.
    fn nic_counters(&self) -> Result<[u64; counter::COUNT], String> {
        let mut sum = [0u64; counter::COUNT];
        for nic in 0..self.workers.len() {
            let c = emp::nic_counters_at(&cluster::socket(&self.dir, nic as u16).to_string_lossy())
                .map_err(|e| format!("counters of NIC {nic}: {e}"))?;
            for (s, v) in sum.iter_mut().zip(c) {
                *s += v;
            }
        }
        Ok(sum)
    }

    fn report(&mut self, elapsed: Duration, nic: &Result<[u64; counter::COUNT], String>) -> Result<(), String> {
        let mut totals: BTreeMap<&str, u64> = STAT_KEYS.iter().map(|&k| (k, 0)).collect();
        let current = self.workers.iter().map(|w| &w.stat);
        for st in self.ended_stats.iter().chain(current) {
            for (k, v) in totals.iter_mut() {
                *v += st.get(*k).copied().unwrap_or(0);
            }
        }
        if let Err(e) = nic {
            self.errors.add("counters", false, "soak", e);
        }
        let t = |k: &str| totals[k];
        let ops = t("sends") + t("recvs") + t("writes") + t("reads") + t("atomics") + t("colls");
        let bytes = t("send_bytes") + t("recv_bytes") + t("write_bytes") + t("read_bytes") + t("coll_bytes");
        if ops == 0 {
            self.errors.add("idle", false, "soak", "no operation completed");
        }
        let unexpected = self.errors.unexpected_total();
        let nicv = nic.as_ref().ok();
        let nc = |i: usize| nicv.map_or(0, |c| c[i]);
        if self.a.json {
            let map = |m: &BTreeMap<String, u64>| {
                let v: Vec<String> = m.iter().map(|(k, v)| format!("\"{}\":{v}", json_escape(k))).collect();
                format!("{{{}}}", v.join(","))
            };
            let ops_json: Vec<String> = totals.iter().map(|(k, v)| format!("\"{k}\":{v}")).collect();
            let samples: Vec<String> = self.errors.samples.iter().map(|s| format!("\"{}\"", json_escape(s))).collect();
            println!(
                "{{\"seed\":{},\"ranks\":{},\"loss\":{},\"seconds\":{:.1},\"operations\":{ops},\"bytes\":{bytes},\
                 \"by_kind\":{{{}}},\"kills\":{},\"restarts\":{},\"rounds_done\":{},\"rounds_aborted\":{},\
                 \"errors_expected\":{},\"errors_unexpected\":{},\"unexpected_samples\":[{}],\
                 \"nic\":{{\"tx_frames\":{},\"retransmits\":{},\"timeouts\":{},\"duplicates\":{},\"msgs_failed\":{}}},\
                 \"ok\":{}}}",
                self.seed,
                self.a.ranks,
                self.a.loss,
                elapsed.as_secs_f64(),
                ops_json.join(","),
                self.kills,
                self.restarts,
                self.rounds_done,
                self.rounds_aborted,
                map(&self.errors.expected),
                map(&self.errors.unexpected),
                samples.join(","),
                nc(counter::TX_FRAMES),
                nc(counter::RETRANSMITS),
                nc(counter::TIMEOUTS),
                nc(counter::DUPLICATES),
                nc(counter::MSGS_FAILED),
                unexpected == 0
            );
        } else {
            println!(
                "emp soak: seed {} — {:.1} s, {} ranks, loss {}",
                self.seed,
                elapsed.as_secs_f64(),
                self.a.ranks,
                self.a.loss
            );
            println!("  operations {ops}, bytes verified {bytes} ({:.1} MiB)", bytes as f64 / (1 << 20) as f64);
            println!(
                "  point-to-point: {} sends ({} B), {} receives ({} B)",
                t("sends"),
                t("send_bytes"),
                t("recvs"),
                t("recv_bytes")
            );
            println!(
                "  RMA: {} writes ({} B), {} reads ({} B); atomics {} (+{} resyncs)",
                t("writes"),
                t("write_bytes"),
                t("reads"),
                t("read_bytes"),
                t("atomics"),
                t("resyncs")
            );
            println!(
                "  collectives: {} operations ({} B) in {} rounds done, {} rounds interrupted by kills",
                t("colls"),
                t("coll_bytes"),
                self.rounds_done,
                self.rounds_aborted
            );
            println!("  kills {}, restarts {}", self.kills, self.restarts);
            let list = |m: &BTreeMap<String, u64>| {
                if m.is_empty() {
                    "none".to_string()
                } else {
                    m.iter().map(|(k, v)| format!("{k} {v}")).collect::<Vec<_>>().join(", ")
                }
            };
            println!("  errors expected: {}", list(&self.errors.expected));
            let reuse = |k: &str| self.errors.expected.get(k).or(self.errors.unexpected.get(k)).copied().unwrap_or(0);
            let (delivered, refused) = (reuse("stale-delivery"), reuse("stale-generation"));
            if delivered + refused > 0 {
                println!(
                    "  endpoint reuse (docs/soak.md): {delivered} messages sent to a killed process reached its \
                     replacement, {refused} first operations on a replacement failed RemotePortClosed"
                );
            }
            println!("  errors unexpected: {}", list(&self.errors.unexpected));
            println!(
                "  NICs: {} frames sent, {} retransmitted, {} timeouts, {} duplicates, {} messages failed",
                nc(counter::TX_FRAMES),
                nc(counter::RETRANSMITS),
                nc(counter::TIMEOUTS),
                nc(counter::DUPLICATES),
                nc(counter::MSGS_FAILED)
            );
        }
        if unexpected == 0 {
            Ok(())
        } else {
            Err(format!("{unexpected} unexpected errors (seed {}; replay with --seed {})", self.seed, self.seed))
        }
    }
}

fn json_escape(s: &str) -> String {
    let mut o = String::with_capacity(s.len());
    for ch in s.chars() {
        match ch {
            '"' => o.push_str("\\\""),
            '\\' => o.push_str("\\\\"),
            c if (c as u32) < 0x20 => o.push_str(&format!("\\u{:04x}", c as u32)),
            c => o.push(c),
        }
    }
    o
}
