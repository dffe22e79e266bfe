//! The job a rank belongs to: its rank, the job's size, an exchange of
//! values between ranks (endpoints first) and a barrier, whichever launcher
//! started it. The launcher is recognized once, from the environment:
//!
//! - `emp run`: `EMP_RANK`, `EMP_SIZE` and the rendezvous directory
//!   `EMP_RDV_DIR`, where every rank publishes its values as files (like an
//!   MPI process-management interface, reduced to what EMP needs);
//! - a PMIx launcher (`mpirun`, `prterun`, `srun --mpi=pmix`):
//!   `PMIX_NAMESPACE` and `PMIX_RANK`; values go through
//!   `PMIx_Put`/`Commit`/`Fence`/`Get` (libpmix is loaded only then);
//! - a static job: `EMP_RANK` and `EMP_SIZE` without a directory (one rank
//!   per node, each on port 0: e.g. one rank per VM).
//!
//! `EMP_RANK` wins over PMIx's variables, so `emp run` started under
//! `mpirun` is still `emp run`'s job. See docs/launch.md.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::pmix::Pmix;
use crate::{Endpoint, Error, Result};

/// Tag of [`Job::barrier`]'s messages in a static job.
pub const BARRIER_TAG: u64 = 0xEB00_0000_0000_0000;
/// Bit 63 of a work request id: [`Job::barrier`]'s own requests.
const BARRIER_WR: u64 = 1 << 63;

/// How the ranks of a job meet.
#[derive(Clone, Debug)]
enum Meeting {
    /// `emp run`'s rendezvous directory.
    Files(PathBuf),
    /// The PMIx launcher's key-value store and fences.
    Pmix(&'static Pmix),
    /// No out-of-band channel: rank r is node r, port 0.
    Static,
}

/// This process's place in a job.
#[derive(Clone, Debug)]
pub struct Job {
    /// Rank (`EMP_RANK`, or PMIx's).
    pub rank: usize,
    /// Ranks in the job (`EMP_SIZE`, or PMIx's `PMIX_JOB_SIZE`).
    pub size: usize,
    meeting: Meeting,
}

fn env_num(name: &str) -> Result<usize> {
    let v =
        std::env::var(name).map_err(|_| Error::Job(format!("{name} is not set: start the program with `emp run`")))?;
    v.parse().map_err(|_| Error::Job(format!("{name}={v:?} is not a number")))
}

/// The first of `names` set in the environment, as a number.
fn env_first(names: &[&str]) -> Result<Option<usize>> {
    for name in names {
        if let Ok(v) = std::env::var(name) {
            return v.parse().map(Some).map_err(|_| Error::Job(format!("{name}={v:?} is not a number")));
        }
    }
    Ok(None)
}

/// Variables launchers set to a process's rank among the job's processes on
/// its host, in the order they are consulted.
pub const LOCAL_RANK_VARIABLES: &[&str] =
    &["EMP_LOCAL_RANK", "PMIX_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID"];

impl Job {
    /// The job of the launcher that started this process: `emp run`'s
    /// (`EMP_RANK`, `EMP_SIZE`, `EMP_RDV_DIR`; without the latter a static
    /// job where rank r is node r, port 0), else PMIx's (`PMIX_NAMESPACE`
    /// and `PMIX_RANK` set: `mpirun`, `prterun`, `srun --mpi=pmix`).
    ///
    /// # Errors
    /// [`Error::Job`] when neither launcher's variables are set, they make
    /// no sense, or PMIx cannot be initialized.
    pub fn from_env() -> Result<Job> {
        if std::env::var_os("EMP_RANK").is_some() {
            let rank = env_num("EMP_RANK")?;
            let size = env_num("EMP_SIZE")?;
            if rank >= size {
                return Err(Error::Job(format!("EMP_RANK {rank} >= EMP_SIZE {size}")));
            }
            let meeting = std::env::var_os("EMP_RDV_DIR").map_or(Meeting::Static, |d| Meeting::Files(d.into()));
            return Ok(Job { rank, size, meeting });
        }
        if crate::pmix::in_environment() {
            let p = Pmix::session()?;
            return Ok(Job { rank: p.rank(), size: p.size(), meeting: Meeting::Pmix(p) });
        }
        Err(Error::Job(
            "not started by a launcher: EMP_RANK is not set (start the program with `emp run`) and neither are \
             PMIX_NAMESPACE and PMIX_RANK (mpirun, prterun, srun --mpi=pmix)"
                .into(),
        ))
    }

    /// Which launcher's means the ranks meet by: `"emp run"`, `"pmix"` or
    /// `"static"`.
    pub fn launcher(&self) -> &'static str {
        match self.meeting {
            Meeting::Files(_) => "emp run",
            Meeting::Pmix(_) => "pmix",
            Meeting::Static => "static",
        }
    }

    /// True when ranks can exchange values ([`Job::exchange`]): through
    /// `emp run`'s rendezvous directory or PMIx; false in a static job.
    pub fn has_rendezvous(&self) -> bool {
        !matches!(self.meeting, Meeting::Static)
    }

    /// This rank's place among the job's ranks on its host: the first of
    /// [`LOCAL_RANK_VARIABLES`] set, else PMIx's `PMIX_LOCAL_RANK`; under
    /// `emp run` (every rank on this host) the rank. `None` in a static job
    /// without those variables.
    ///
    /// # Errors
    /// [`Error::Job`] when a variable is not a number or PMIx fails.
    pub fn local_rank(&self) -> Result<Option<usize>> {
        if let Some(n) = env_first(LOCAL_RANK_VARIABLES)? {
            return Ok(Some(n));
        }
        match self.meeting {
            Meeting::Files(_) => Ok(Some(self.rank)),
            Meeting::Pmix(p) => p.local_rank().map(Some),
            Meeting::Static => Ok(None),
        }
    }

    /// The NIC this rank uses: `EMP_DEVICE` if set; else, with `EMP_CLUSTER`
    /// naming a cluster file, one of the nodes of this host (the host named
    /// by `EMP_HOST`, else by the hostname) chosen by local rank, round
    /// robin: local rank l uses the host's (l mod n)-th node in id order.
    ///
    /// # Errors
    /// [`Error::NoDevice`] when neither variable is set; [`Error::Job`] when
    /// the cluster file cannot be read, does not name this host, or the
    /// local rank is unknown.
    pub fn device_path(&self) -> Result<PathBuf> {
        if let Some(p) = std::env::var_os("EMP_DEVICE") {
            return Ok(p.into());
        }
        let Some(file) = std::env::var_os("EMP_CLUSTER") else { return Err(Error::NoDevice) };
        let file = PathBuf::from(file);
        let config = emp_config::ClusterConfig::load(&file)
            .map_err(|e| Error::Job(format!("EMP_CLUSTER={}: {e}", file.display())))?;
        let (host, how) = match std::env::var("EMP_HOST") {
            Ok(h) => (h, "EMP_HOST"),
            Err(_) => (
                nix::unistd::gethostname()
                    .map_err(|e| Error::Job(format!("gethostname: {e}")))?
                    .to_string_lossy()
                    .into_owned(),
                "the hostname",
            ),
        };
        let local = self.local_rank()?.ok_or_else(|| {
            Error::Job(format!(
                "EMP_CLUSTER: this rank's local rank is unknown (none of {} is set)",
                LOCAL_RANK_VARIABLES.join(", ")
            ))
        })?;
        node_for_local_rank(&config, &file, &host, how, local)
    }

    /// Publishes `value` under `key` for this rank and returns every rank's
    /// value (waiting up to `timeout` for all of them). Collective: every
    /// rank calls it with the same key, once per key.
    ///
    /// # Errors
    /// [`Error::Job`] in a static job or when PMIx fails; [`Error::Timeout`]
    /// when a rank's value does not come in time.
    pub fn exchange(&self, key: &str, value: &str, timeout: Duration) -> Result<Vec<String>> {
        match &self.meeting {
            Meeting::Files(dir) => self.exchange_files(dir, key, value, timeout),
            Meeting::Pmix(p) => p.exchange(key, value, timeout),
            Meeting::Static => Err(Error::Job("no rendezvous directory (EMP_RDV_DIR) in a static job".into())),
        }
    }

    fn exchange_files(&self, dir: &Path, key: &str, value: &str, timeout: Duration) -> Result<Vec<String>> {
        let path = |r: usize| dir.join(format!("{key}.{r}"));
        let tmp = dir.join(format!(".{key}.{}.tmp", self.rank));
        std::fs::write(&tmp, value)?;
        std::fs::rename(&tmp, path(self.rank))?;
        let end = Instant::now() + timeout;
        let mut out = Vec::with_capacity(self.size);
        for r in 0..self.size {
            loop {
                match std::fs::read_to_string(path(r)) {
                    Ok(v) => {
                        out.push(v);
                        break;
                    }
                    Err(_) if Instant::now() < end => std::thread::sleep(Duration::from_millis(2)),
                    Err(_) => return Err(Error::Timeout),
                }
            }
        }
        Ok(out)
    }

    /// Exchanges endpoints: element `r` is rank `r`'s.
    pub fn endpoints(&self, mine: Endpoint) -> Result<Vec<Endpoint>> {
        if !self.has_rendezvous() {
            let eps: Vec<Endpoint> = (0..self.size).map(|r| Endpoint { node: r as u16, port: 0 }).collect();
            if eps[self.rank] != mine {
                return Err(Error::Protocol(format!(
                    "static job: rank {} should be {}, is {mine}",
                    self.rank, eps[self.rank]
                )));
            }
            return Ok(eps);
        }
        let all = self.exchange("ep", &format!("{} {}", mine.node, mine.port), Duration::from_secs(30))?;
        all.iter()
            .map(|s| {
                let mut it = s.split_whitespace().map(|x| x.parse::<u16>());
                match (it.next(), it.next()) {
                    (Some(Ok(node)), Some(Ok(port))) => Ok(Endpoint { node, port }),
                    _ => Err(Error::Protocol(format!("bad endpoint record {s:?}"))),
                }
            })
            .collect()
    }

    /// A barrier of all ranks through `dev`'s port. With a rendezvous
    /// directory or PMIx it is [`Job::sync`]; a static job (ranks in separate VMs)
    /// exchanges zero-byte messages with every other rank over EMP itself,
    /// retrying while a peer's port is not open yet, or its NIC is not
    /// running yet (guests boot at different speeds: frames to a NIC
    /// without firmware go unanswered until the retry limit). Its completions are
    /// consumed with [`Device::wait_wr`](crate::Device::wait_wr); the caller's stay in the CQ.
    ///
    /// Reserved: tag [`BARRIER_TAG`] from these endpoints, and work
    /// request ids with bit 63 set.
    pub fn barrier(&self, dev: &mut crate::Device, name: &str) -> Result<()> {
        if self.has_rendezvous() {
            return self.sync(name);
        }
        // Matching is in order per pair of endpoints, so one tag serves
        // every barrier: a peer's next barrier message cannot overtake.
        let eps = self.endpoints(dev.endpoint())?;
        let others: Vec<usize> = (0..self.size).filter(|&r| r != self.rank).collect();
        for &r in &others {
            dev.post_recv(BARRIER_WR | r as u64, eps[r], BARRIER_TAG, 0, &[])?;
        }
        for &r in &others {
            let wr = BARRIER_WR | 1 << 62 | r as u64;
            let end = Instant::now() + Duration::from_secs(60);
            loop {
                dev.post_send(wr, eps[r], BARRIER_TAG, &[])?;
                let c = dev.wait_wr(wr, Some(Duration::from_secs(60)))?;
                match c.status {
                    crate::Status::Success => break,
                    crate::Status::RemotePortClosed | crate::Status::RetryLimitExceeded if Instant::now() < end => {
                        std::thread::sleep(Duration::from_millis(20));
                    }
                    s => return Err(Error::Protocol(format!("barrier {name:?}: send to rank {r}: {}", s.as_str()))),
                }
            }
        }
        for &r in &others {
            let c = dev.wait_wr(BARRIER_WR | r as u64, Some(Duration::from_secs(60)))?;
            if c.status != crate::Status::Success {
                return Err(Error::Protocol(format!("barrier {name:?}: from rank {r}: {}", c.status.as_str())));
            }
        }
        Ok(())
    }

    /// Waits until every rank reached the same `name` (a slow barrier for
    /// setup and teardown; collectives will have a NIC barrier).
    pub fn sync(&self, name: &str) -> Result<()> {
        match self.meeting {
            Meeting::Pmix(p) => p.barrier(name, Duration::from_secs(60)),
            _ => self.exchange(name, "", Duration::from_secs(60)).map(|_| ()),
        }
    }
}

/// The socket of the node host `host` (found by `how`) uses for local rank
/// `local`: the host's nodes in id order, round robin.
fn node_for_local_rank(
    config: &emp_config::ClusterConfig,
    file: &Path,
    host: &str,
    how: &str,
    local: usize,
) -> Result<PathBuf> {
    // A hostname may be fully qualified where the cluster file names the
    // short one.
    let short = host.split('.').next().unwrap_or(host);
    let h = config.host(host).or_else(|| config.host(short)).ok_or_else(|| {
        let names: Vec<&str> = config.hosts.iter().map(|h| h.name.as_str()).collect();
        Error::Job(format!(
            "{}: no host {host:?} ({how}; set EMP_HOST to this host's name in the file): hosts are {}",
            file.display(),
            names.join(", ")
        ))
    })?;
    let nodes: Vec<u16> = config.nodes_on(&h.name).map(|n| n.id).collect();
    if nodes.is_empty() {
        return Err(Error::Job(format!("{}: host {:?} runs no node", file.display(), h.name)));
    }
    let id = nodes[local % nodes.len()];
    config.socket(id).ok_or_else(|| Error::Job(format!("{}: node {id} has no socket", file.display())))
}

#[cfg(test)]
mod tests {
    use super::*;

    const CLUSTER: &str = r#"
[cluster]
wire = "udp"
[[host]]
name = "a"
dir = "/run/emp-a"
[[host]]
name = "b"
dir = "/run/emp-b"
[[node]]
id = 0
host = "a"
udp = "198.18.0.1:7000"
[[node]]
id = 1
host = "b"
udp = "198.18.0.2:7000"
[[node]]
id = 2
host = "b"
udp = "198.18.0.2:7001"
"#;

    #[test]
    fn local_ranks_take_the_hosts_nodes_round_robin() {
        let c = emp_config::ClusterConfig::parse(CLUSTER).expect("cluster file");
        let f = Path::new("c.toml");
        let pick = |host: &str, l: usize| node_for_local_rank(&c, f, host, "test", l).expect("a node");
        assert_eq!(pick("a", 0), PathBuf::from("/run/emp-a/nic0.sock"));
        assert_eq!(pick("a", 3), PathBuf::from("/run/emp-a/nic0.sock"));
        assert_eq!(pick("b", 0), PathBuf::from("/run/emp-b/nic1.sock"));
        assert_eq!(pick("b", 1), PathBuf::from("/run/emp-b/nic2.sock"));
        assert_eq!(pick("b", 2), PathBuf::from("/run/emp-b/nic1.sock"));
        assert_eq!(pick("b.example.org", 1), PathBuf::from("/run/emp-b/nic2.sock"));
    }

    #[test]
    fn an_unknown_host_names_the_known_ones() {
        let c = emp_config::ClusterConfig::parse(CLUSTER).expect("cluster file");
        let e = node_for_local_rank(&c, Path::new("c.toml"), "z", "EMP_HOST", 0).expect_err("no host z");
        let msg = e.to_string();
        assert!(msg.contains("no host \"z\"") && msg.contains("hosts are a, b"), "{msg}");
    }
}
