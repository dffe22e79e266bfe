//! `emp gang --slice-ms T --job "N prog args…" --job …`: gang scheduling
//! (SCore-D's role, docs/context-switch.md). Runs two or more parallel jobs
//! on the cluster's NICs when the NICs have too few port slots for all of
//! them at once: one job runs at a time, and every time slice every node's
//! ports are switched in step to the next job.
//!
//! A switch out: SIGSTOP every rank of the job (so none touches its window
//! meanwhile), suspend each rank's ports on its NIC, wait (bounded) until
//! all are stable, save them into daemon memory (their slots become free).
//! A switch in: restore each port into the slot it had (so the window the
//! process maps is its own again), resume, SIGCONT. The ranks never
//! cooperate; they see the switch only as time. A job not started yet is
//! started when it is first switched in.
//!
//! With `--devices` the NICs are reached through emp.ko (`/dev/emp-nic…`,
//! e.g. in a guest): the same steps go to the driver (`EMP_IOC_GANG`), which
//! keeps the saved images in kernel memory.
//!
//! With `--config` the NICs are a cluster file's nodes, on any hosts: rank
//! r runs on node r mod nodes. The scheduler starts one `emp gang-agent`
//! per node through its host's `launch` prefix (`gang_agent.rs`), and the
//! agent starts, signals, watches and reaps that node's ranks and carries
//! the GANG steps to the node's daemon on its host: pids and sockets are
//! the host's own, never the scheduler's.

use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use emp_uapi::attach::gang;

use crate::cluster::{read_state, socket};
use crate::gang_agent::{exit_code, nic_gang, proc_state, Agent, Refusal};

/// Settings of one `emp gang` run.
pub struct GangArgs {
    /// Cluster directory.
    pub dir: PathBuf,
    /// The NICs' kernel devices; empty: the cluster's daemons in `dir`.
    pub devices: Vec<String>,
    /// A cluster file: its nodes' daemons, ranks through its hosts' launch.
    pub config: Option<PathBuf>,
    /// Jobs, each "N program args…".
    pub jobs: Vec<String>,
    /// Time slice.
    pub slice: Duration,
    /// How long a switch waits for the ports to become stable.
    pub stable: Duration,
    /// Kill everything after this long.
    pub timeout: Option<Duration>,
}

/// How long a started job's ranks may take to open their ports.
const START_BOUND: Duration = Duration::from_secs(30);
/// How long a restore waits for a slot its last holder is releasing.
const RESTORE_BOUND: Duration = Duration::from_secs(2);
/// How long a stopped rank may take to reach the stopped state.
const STOP_BOUND: Duration = Duration::from_secs(2);

/// A running rank: a child of this process, or of node `node`'s agent.
enum Proc {
    Here(Child),
    There { node: usize, pid: u32 },
}

impl Proc {
    fn pid(&self) -> u32 {
        match self {
            Proc::Here(c) => c.id(),
            Proc::There { pid, .. } => *pid,
        }
    }
}

struct Job {
    ranks: usize,
    argv: Vec<String>,
    rdv: PathBuf,
    kids: Vec<Option<Proc>>,
    started: bool,
    /// Exit status once every rank is gone.
    status: Option<i32>,
    /// Switched out (its ranks stopped, their ports saved).
    out: bool,
}

impl Job {
    fn parse(spec: &str, dir: &Path, index: usize) -> Result<Job, String> {
        let mut words = spec.split_whitespace();
        let ranks = words
            .next()
            .and_then(|w| w.parse::<usize>().ok())
            .filter(|&n| n > 0)
            .ok_or_else(|| format!("--job {spec:?}: expected \"RANKS program [args…]\""))?;
        let argv: Vec<String> = words.map(str::to_owned).collect();
        if argv.is_empty() {
            return Err(format!("--job {spec:?}: no program"));
        }
        let rdv = dir.join(format!("gang-{}-{index}", std::process::id()));
        Ok(Job { ranks, argv, rdv, kids: Vec::new(), started: false, status: None, out: false })
    }

    fn live(&self) -> impl Iterator<Item = (usize, &Proc)> + '_ {
        self.kids.iter().enumerate().filter_map(|(r, k)| k.as_ref().map(|p| (r, p)))
    }

    fn signal(&self, agents: &mut [Agent], sig: i32) -> Result<(), String> {
        for (_, p) in self.live() {
            match p {
                // SAFETY: kill has no memory preconditions; `pid` is our child, not yet reaped.
                Proc::Here(c) => unsafe {
                    libc::kill(c.id() as i32, sig);
                },
                Proc::There { node, pid } => {
                    // A rank that exited meanwhile is reaped later.
                    let _ = agents[*node].call(&["signal".into(), sig.to_string(), pid.to_string()])?;
                }
            }
        }
        Ok(())
    }

    fn kill(&mut self, agents: &mut [Agent]) {
        for k in &mut self.kids {
            match k.take() {
                Some(Proc::Here(mut c)) => {
                    let _ = c.kill();
                    let _ = c.wait();
                }
                Some(Proc::There { node, pid }) => {
                    let _ = agents[node].call(&["kill".into(), pid.to_string()]);
                }
                None => {}
            }
        }
    }

    /// Reaps exited ranks; a failing rank ends the job.
    fn reap(&mut self, agents: &mut [Agent], name: usize) -> Result<(), String> {
        let mut failed = None;
        for (r, k) in self.kids.iter_mut().enumerate() {
            let code = match k {
                None => continue,
                Some(Proc::Here(c)) => match c.try_wait() {
                    Ok(Some(st)) => exit_code(st),
                    _ => continue,
                },
                Some(Proc::There { node, pid }) => match agents[*node].call(&["wait".into(), pid.to_string()])? {
                    Ok(w) if w.first().map(String::as_str) == Some("exited") => {
                        w.get(1).and_then(|c| c.parse().ok()).unwrap_or(1)
                    }
                    Ok(_) => continue,
                    Err((_, e)) => return Err(format!("job {name} rank {r}: {e}")),
                },
            };
            *k = None;
            if code != 0 && failed.is_none() {
                eprintln!("emp gang: job {name} rank {r} exited with status {code}; stopping the job");
                failed = Some(code);
            }
        }
        if let Some(code) = failed {
            // Its ports go with its processes: the daemon releases them, or
            // discards their saved contexts if the job is switched out.
            self.kill(agents);
            self.status = Some(code);
        } else if self.started && self.kids.iter().all(Option::is_none) {
            self.status.get_or_insert(0);
        }
        Ok(())
    }
}

/// Runs the jobs; returns the first failing job's status (0 if all pass).
pub fn gang(a: &GangArgs) -> Result<i32, String> {
    if a.jobs.len() < 2 {
        return Err("emp gang: give at least two --job \"RANKS program [args…]\"".into());
    }
    if a.slice.is_zero() {
        return Err("emp gang: --slice-ms must be at least 1".into());
    }
    let mut agents: Vec<Agent> = Vec::new();
    let nics: Vec<String> = if let Some(file) = &a.config {
        let cfg = emp_config::ClusterConfig::load(file).map_err(|e| e.to_string())?;
        let emp = std::env::current_exe().map_err(|e| format!("cannot find this emp: {e}"))?;
        let emp = emp.to_string_lossy();
        let mut socks = Vec::new();
        for node in &cfg.nodes {
            let sock = cfg.socket(node.id).ok_or_else(|| format!("node {}: no socket", node.id))?;
            let sock = sock.to_string_lossy().into_owned();
            let mut agent = Agent::start(&cfg.host(&node.host).expect("checked on load").launch, &emp, &sock)?;
            // The node's daemon must answer on its host (up?).
            agent.call(&["hello".into()])?.map_err(|(_, e)| format!("emp gang --config: node {}: {e}", node.id))?;
            agents.push(agent);
            socks.push(sock);
        }
        socks
    } else if a.devices.is_empty() {
        let s = read_state(&a.dir)?;
        (0..s.nics).map(|n| socket(&a.dir, n).to_string_lossy().into_owned()).collect()
    } else {
        if let Some(bad) = a.devices.iter().find(|d| !d.starts_with("/dev/")) {
            return Err(format!("emp gang: --devices {bad:?}: expected a /dev/ path of emp.ko"));
        }
        a.devices.clone()
    };
    if nics.is_empty() {
        return Err("emp gang: no NICs".into());
    }
    std::fs::create_dir_all(&a.dir).map_err(|e| format!("{}: {e}", a.dir.display()))?;
    let mut jobs = a.jobs.iter().enumerate().map(|(i, j)| Job::parse(j, &a.dir, i)).collect::<Result<Vec<_>, _>>()?;
    let mut g = Gang { nics, agents, stable: a.stable, switches: 0, unstable: 0 };
    let result = g.schedule(&mut jobs, a.slice, a.timeout);
    for j in &mut jobs {
        // SIGKILL ends a stopped rank too; it is never continued without
        // its ports (it would find its window serving another job).
        j.kill(&mut g.agents);
        let _ = std::fs::remove_dir_all(&j.rdv);
    }
    let status = result?;
    println!(
        "emp gang: {} jobs, {} switches, {} switches put off (ports not stable)",
        jobs.len(),
        g.switches,
        g.unstable
    );
    for (i, j) in jobs.iter().enumerate() {
        println!("emp gang: job {i} exited with status {}", j.status.unwrap_or(124));
    }
    Ok(status)
}

struct Gang {
    /// Each NIC's daemon socket or kernel device (rank r uses r mod len),
    /// as its host names it.
    nics: Vec<String>,
    /// With `--config`: each NIC's agent on its host (rank r uses r mod
    /// len); empty: every rank and NIC is here.
    agents: Vec<Agent>,
    stable: Duration,
    switches: u64,
    unstable: u64,
}

impl Gang {
    fn schedule(&mut self, jobs: &mut [Job], slice: Duration, timeout: Option<Duration>) -> Result<i32, String> {
        let start = Instant::now();
        let mut current = 0;
        self.start_job(&mut jobs[0], 0)?;
        let mut slice_end = Instant::now() + slice;
        loop {
            for (i, j) in jobs.iter_mut().enumerate() {
                if j.started && j.status.is_none() {
                    j.reap(&mut self.agents, i)?;
                }
            }
            if jobs.iter().all(|j| j.status.is_some()) {
                return Ok(jobs.iter().map(|j| j.status.unwrap_or(0)).find(|&c| c != 0).unwrap_or(0));
            }
            if timeout.is_some_and(|t| start.elapsed() > t) {
                eprintln!("emp gang: timed out after {:?}", timeout.expect("some"));
                return Ok(124);
            }
            let finished = jobs[current].status.is_some();
            if finished || Instant::now() >= slice_end {
                let next = (1..=jobs.len()).map(|k| (current + k) % jobs.len()).find(|&k| jobs[k].status.is_none());
                if let Some(next) = next.filter(|&n| n != current) {
                    if finished || self.switch_out(&mut jobs[current], current)? {
                        self.switch_in(&mut jobs[next], next)?;
                        current = next;
                        self.switches += 1;
                    }
                }
                slice_end = Instant::now() + slice;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    fn sock(&self, rank: usize) -> &str {
        &self.nics[rank % self.nics.len()]
    }

    /// GANG `action` on rank `r`'s process `p`, on its NIC: (arg0, arg1),
    /// or the NIC's (or agent's) refusal. `Err` only when an agent is gone.
    fn nic_gang(&mut self, r: usize, p: &Proc, action: u64) -> Result<Result<(u64, u64), Refusal>, String> {
        match p {
            Proc::Here(c) => Ok(nic_gang(self.sock(r), action, c.id())),
            Proc::There { node, pid } => {
                Ok(self.agents[*node].call(&["gang".into(), action.to_string(), pid.to_string()])?.map(|w| {
                    let n = |i: usize| w.get(i).and_then(|x| x.parse().ok()).unwrap_or(0);
                    (n(0), n(1))
                }))
            }
        }
    }

    /// `/proc`'s state letter of `p` on its host (`None` once it is gone).
    fn state(&mut self, p: &Proc) -> Result<Option<char>, String> {
        match p {
            Proc::Here(c) => Ok(proc_state(c.id())),
            Proc::There { node, pid } => Ok(match self.agents[*node].call(&["state".into(), pid.to_string()])? {
                Ok(w) => w.first().and_then(|l| l.chars().next()).filter(|&c| c != '-'),
                // Reaped by the agent already: gone.
                Err(_) => None,
            }),
        }
    }

    /// Has `p` exited (a zombie not reaped yet, or gone)?
    fn exited(&mut self, p: &Proc) -> Result<bool, String> {
        Ok(matches!(self.state(p)?, None | Some('Z' | 'X')))
    }

    /// `action` on every live rank's ports; returns the replies' (`arg[0]`, `arg[1]`) summed.
    fn each(&mut self, job: &Job, action: u64) -> Result<(u64, u64), String> {
        let mut sum = (0, 0);
        for (r, p) in job.live() {
            match self.nic_gang(r, p, action)? {
                Ok(m) => sum = (sum.0 + m.0, sum.1 + m.1),
                // A rank that exited and is not reaped yet: the daemon is
                // releasing its ports on its own, there is nothing to switch.
                Err(_) if self.exited(p)? => {}
                Err((_, e)) => {
                    return Err(format!("rank {r} (pid {}): {} its ports: {e}", p.pid(), action_name(action)))
                }
            }
        }
        Ok(sum)
    }

    fn start_job(&mut self, job: &mut Job, name: usize) -> Result<(), String> {
        std::fs::create_dir_all(&job.rdv).map_err(|e| format!("{}: {e}", job.rdv.display()))?;
        for r in 0..job.ranks {
            let env = [
                ("EMP_DEVICE", self.sock(r).to_owned()),
                ("EMP_RANK", r.to_string()),
                ("EMP_SIZE", job.ranks.to_string()),
                ("EMP_RDV_DIR", job.rdv.to_string_lossy().into_owned()),
            ];
            let p = if self.agents.is_empty() {
                let mut c = Command::new(&job.argv[0]);
                c.args(&job.argv[1..]).envs(env);
                Proc::Here(c.spawn().map_err(|e| format!("{}: {e}", job.argv[0]))?)
            } else {
                let node = r % self.agents.len();
                let mut req: Vec<String> = vec!["spawn".into(), env.len().to_string()];
                req.extend(env.iter().map(|(k, v)| format!("{k}={v}")));
                req.extend(job.argv.iter().cloned());
                let w = self.agents[node].call(&req)?.map_err(|(_, e)| format!("node {node}: rank {r}: {e}"))?;
                let pid = w.first().and_then(|p| p.parse().ok()).ok_or("a gang agent replied no pid")?;
                Proc::There { node, pid }
            };
            job.kids.push(Some(p));
        }
        job.started = true;
        // Switching a rank out before it opened its port would leave it
        // holding a slot it cannot use: wait until every live rank has one.
        let end = Instant::now() + START_BOUND;
        loop {
            // A rank that already exited needs no port; a failing one ends the job.
            job.reap(&mut self.agents, name)?;
            if job.status.is_some() {
                if trace() {
                    eprintln!("emp gang: job {name} ended before all its ranks had ports");
                }
                return Ok(());
            }
            let mut opened = true;
            for (r, p) in job.live() {
                match self.nic_gang(r, p, gang::PORTS)? {
                    Ok((ports, _)) => opened &= ports > 0,
                    Err((_, e)) => return Err(format!("asking the NIC for rank {r}'s ports: {e}")),
                }
            }
            if opened {
                if trace() {
                    eprintln!("emp gang: job {name} in (started; every rank has its port)");
                }
                return Ok(());
            }
            if Instant::now() >= end {
                return Err(format!("a rank of {} opened no port within {START_BOUND:?}", job.argv[0]));
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    /// Switches `job` out; false if its ports did not become stable in
    /// time (they are resumed and the job runs on; a later slice retries:
    /// two peers suspended together may wait on each other).
    fn switch_out(&mut self, job: &mut Job, name: usize) -> Result<bool, String> {
        job.signal(&mut self.agents, libc::SIGSTOP)?;
        self.wait_stopped(job)?;
        let (ports, _) = self.each(job, gang::SUSPEND)?;
        let end = Instant::now() + self.stable;
        loop {
            let (n, stable) = self.each(job, gang::STABLE)?;
            if stable == n {
                break;
            }
            if Instant::now() >= end {
                eprintln!(
                    "emp gang: job {name}: {} of {n} ports not stable after {:?}; resuming it, retrying next slice",
                    n - stable,
                    self.stable
                );
                self.each(job, gang::RESUME)?;
                job.signal(&mut self.agents, libc::SIGCONT)?;
                self.unstable += 1;
                return Ok(false);
            }
            std::thread::sleep(Duration::from_micros(200));
        }
        let saved = self.each(job, gang::SAVE)?.0;
        if trace() {
            eprintln!("emp gang: job {name} out ({saved} ports saved)");
        }
        // A save that fails is an error above; fewer saved than suspended
        // means ports closed meanwhile: a rank that was exiting when it
        // was stopped (its TAP summary printed) released its port.
        if saved < ports && trace() {
            eprintln!("emp gang: job {name}: {} of {ports} ports closed while being switched out", ports - saved);
        }
        job.out = true;
        Ok(true)
    }

    fn switch_in(&mut self, job: &mut Job, name: usize) -> Result<(), String> {
        if !job.started {
            return self.start_job(job, name);
        }
        // A rank of the job switched out last may have exited a moment ago:
        // its daemon connection thread then still holds its slot for a
        // little while (`EBUSY`), so a taken slot is retried, bounded.
        let end = Instant::now() + RESTORE_BOUND;
        let mut restored = 0;
        for (r, p) in job.live() {
            loop {
                match self.nic_gang(r, p, gang::RESTORE)? {
                    Ok((n, _)) => {
                        restored += n;
                        break;
                    }
                    Err((libc::EBUSY, _)) if Instant::now() < end => std::thread::sleep(Duration::from_millis(1)),
                    Err(_) if self.exited(p)? => break,
                    Err((_, e)) => return Err(format!("job {name} rank {r}: restoring its ports: {e}")),
                }
            }
        }
        self.each(job, gang::RESUME)?;
        if trace() {
            eprintln!("emp gang: job {name} in ({restored} ports restored)");
        }
        job.out = false;
        job.signal(&mut self.agents, libc::SIGCONT)
    }

    /// Waits until every live rank of `job` is stopped (its state `T` in
    /// its host's /proc), so none is half way through touching its window.
    fn wait_stopped(&mut self, job: &Job) -> Result<(), String> {
        let end = Instant::now() + STOP_BOUND;
        for (r, p) in job.live() {
            loop {
                // Gone (`None`, or a zombie) counts: it touches nothing any more.
                if matches!(self.state(p)?, None | Some('T' | 't' | 'Z' | 'X')) {
                    break;
                }
                if Instant::now() >= end {
                    return Err(format!("rank {r} (pid {}) did not stop within {STOP_BOUND:?}", p.pid()));
                }
                std::thread::sleep(Duration::from_micros(100));
            }
        }
        Ok(())
    }
}

/// `EMP_GANG_TRACE` is set: print each switch.
fn trace() -> bool {
    std::env::var_os("EMP_GANG_TRACE").is_some()
}

fn action_name(action: u64) -> &'static str {
    match action {
        gang::SUSPEND => "suspending",
        gang::STABLE => "asking whether stable",
        gang::SAVE => "saving",
        gang::RESTORE => "restoring",
        gang::RESUME => "resuming",
        _ => "counting",
    }
}
