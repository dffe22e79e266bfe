//! Rank rendezvous for programs started by `emp run`: every rank publishes
//! its endpoint as a file in `EMP_RDV_DIR` and reads everyone else's (like
//! an MPI process-management interface, reduced to what EMP needs).

use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::{Endpoint, Error, Result};

/// Tag of [`Job::barrier`]'s messages in a static job.
pub const BARRIER_TAG: u64 = 0xEB00_0000_0000_0000;
/// Bit 63 of a work request id: [`Job::barrier`]'s own requests.
const BARRIER_WR: u64 = 1 << 63;

/// This process's place in a job.
#[derive(Clone, Debug)]
pub struct Job {
    /// Rank (`EMP_RANK`).
    pub rank: usize,
    /// Ranks in the job (`EMP_SIZE`).
    pub size: usize,
    /// The rendezvous directory; `None` for a static job (one rank per
    /// node, each on port 0: e.g. one rank per VM), which has no
    /// file-based exchange.
    dir: Option<PathBuf>,
}

fn env_num(name: &str) -> Result<usize> {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| Error::Protocol(format!("{name} is not set: start the program with `emp run`")))
}

impl Job {
    /// The job from `EMP_RANK`, `EMP_SIZE` and `EMP_RDV_DIR` (without the
    /// latter: a static job where rank r is node r, port 0).
    pub fn from_env() -> Result<Job> {
        let rank = env_num("EMP_RANK")?;
        let size = env_num("EMP_SIZE")?;
        let dir = std::env::var("EMP_RDV_DIR").ok().map(PathBuf::from);
        if rank >= size {
            return Err(Error::Protocol(format!("EMP_RANK {rank} >= EMP_SIZE {size}")));
        }
        Ok(Job { rank, size, dir })
    }

    /// True when ranks can meet through a rendezvous directory.
    pub fn has_rendezvous(&self) -> bool {
        self.dir.is_some()
    }

    /// Publishes `value` under `key` for this rank and returns every rank's
    /// value (waiting up to `timeout` for all of them).
    pub fn exchange(&self, key: &str, value: &str, timeout: Duration) -> Result<Vec<String>> {
        let dir = self
            .dir
            .as_ref()
            .ok_or_else(|| Error::Protocol("no rendezvous directory (EMP_RDV_DIR) in a static job".into()))?;
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
        if self.dir.is_none() {
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
    /// directory it is [`Job::sync`]; a static job (ranks in separate VMs)
    /// exchanges zero-byte messages with every other rank over EMP itself,
    /// retrying while a peer's port is not open yet, or its NIC is not
    /// running yet (guests boot at different speeds: frames to a NIC
    /// without firmware go unanswered until the retry limit). Its completions are
    /// consumed with [`Device::wait_wr`](crate::Device::wait_wr); the caller's stay in the CQ.
    ///
    /// Reserved: tag [`BARRIER_TAG`] from these endpoints, and work
    /// request ids with bit 63 set.
    pub fn barrier(&self, dev: &mut crate::Device, name: &str) -> Result<()> {
        if self.dir.is_some() {
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
        self.exchange(name, "", Duration::from_secs(60)).map(|_| ())
    }
}
